"""The engine's load signal: one record per step, and its running averages.

The same numbers drive speculation and scaling: the verify-length controller reads a step's occupancy (how many
tokens the step already carries against the budget, how many sequences decode, how many requests wait, how much
cached context its attention reads), and a replica publishes the running averages of the same records to Serve's
autoscaler and to Prometheus.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

IDLE_TICK_S = 0.1  # with no steps, the averages decay as if an empty step ran every this many seconds


@dataclass
class StepLoad:
    """One engine step, as plain numbers."""

    running: int = 0  # sequences running after scheduling
    waiting: int = 0  # requests waiting for admission
    max_num_seqs: int = 1
    tokens: int = 0  # tokens in the packed forward, verify segments included
    token_budget: int = 1
    decoding: int = 0  # sequences emitting a token this step
    eligible: int = 0  # decoding sequences that could have speculated
    drafted: int = 0  # sequences that verified at least one draft
    verify_tokens: int = 0  # draft tokens verified
    kv_tokens: int = 0  # cached tokens the step's sequences read (the sum of their computed tokens)

    @property
    def base_tokens(self) -> int:
        """Tokens the step carries without drafts."""
        return self.tokens - self.verify_tokens


class LoadMonitor:
    """Exponential averages of the step records, in the names the autoscaling policy and the dashboards use."""

    def __init__(self, alpha: float = 0.1):
        self.alpha = alpha
        self.last = StepLoad()
        self.last_time = time.monotonic()
        self.avg = {"seq_occupancy": 0.0, "token_occupancy": 0.0, "verify_tokens_per_step": 0.0,
                    "verify_tokens_per_seq": 0.0, "spec_squeezed": 0.0}

    def observe(self, step: StepLoad) -> None:
        self.last = step
        self.last_time = time.monotonic()
        a = self.alpha
        sample = {
            "seq_occupancy": step.running / max(step.max_num_seqs, 1),
            "token_occupancy": step.tokens / max(step.token_budget, 1),
            "verify_tokens_per_step": float(step.verify_tokens),
        }
        if step.decoding:
            sample["verify_tokens_per_seq"] = step.verify_tokens / step.decoding
        if step.eligible:  # speculation was possible: was it squeezed to nothing?
            sample["spec_squeezed"] = 1.0 if step.drafted == 0 else 0.0
        for key, value in sample.items():
            self.avg[key] += a * (value - self.avg[key])

    def signals(self, kv_usage: float) -> dict[str, float]:
        """The replica's load signals (all floats, as Serve's record_autoscaling_stats requires). A replica that
        has not stepped for a while decays towards empty, as if it had run empty steps."""
        idle_ticks = int((time.monotonic() - self.last_time) / IDLE_TICK_S)
        if idle_ticks > 2:
            empty = StepLoad(waiting=self.last.waiting, max_num_seqs=self.last.max_num_seqs,
                             token_budget=self.last.token_budget)
            for _ in range(min(idle_ticks, 100)):
                self.observe(empty)
                # An empty replica has room for any verify length: speculation is no longer squeezed.
                self.avg["spec_squeezed"] *= 1 - self.alpha
        return {"queue_depth": float(self.last.waiting), "running": float(self.last.running),
                "kv_usage": float(kv_usage), **{k: float(v) for k, v in self.avg.items()}}
