"""Per-request sampling parameters, validated on construction."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.spec_mode import parse_speculation


MAX_LOGPROBS = 64


@dataclass
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    # Return the top-`logprobs` log-probabilities (of the unmodified model distribution) for every output token.
    logprobs: int | None = None
    # Speculation mode for this request: None (engine default), "off", "fixed:K", "threshold:C", "adaptive"; the
    # last three optionally with "+lookup" (prompt lookup drafts where the text repeats itself).
    speculation: str | None = None
    # Optional per-token latency target (seconds); caps this request's verify length.
    target_tpot_s: float | None = None
    # The OpenAI API's and vLLM's penalties (engine/penalties.py): they change the target's distribution, and
    # speculation verifies against the changed one.
    presence_penalty: float = 0.0  # subtracted once from every token the output holds
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # divides positive (multiplies negative) logits of prompt and output tokens
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    _stop: list[str] = field(init=False, repr=False, default_factory=list)

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number, got {type(value).__name__}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not _is_int(self.top_k) or (self.top_k < 1 and self.top_k not in (-1, 0)):
            raise ValueError(f"top_k must be -1 (disabled) or a positive integer, got {self.top_k!r}")
        if self.top_k == 0:
            self.top_k = -1
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError("stop must be a non-empty string or a list of non-empty strings")
        self._stop = stop
        ids = list(self.stop_token_ids or [])
        if any(not _is_int(t) or t < 0 for t in ids):
            raise ValueError("stop_token_ids must be non-negative integers")
        self.stop_token_ids = ids
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        if self.target_tpot_s is not None and not (_is_number(self.target_tpot_s) and self.target_tpot_s > 0):
            raise ValueError(f"target_tpot_s must be a positive number, got {self.target_tpot_s!r}")
        if self.speculation is not None:
            parse_speculation(self.speculation)  # raises ValueError on a bad mode
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be a number in [-2, 2], got {value!r}")
        # Bounded away from 0: logits / r must stay finite in the model's dtype (a denormal r would make it inf).
        if not _is_number(self.repetition_penalty) or not 0.01 <= self.repetition_penalty <= 100.0:
            raise ValueError(f"repetition_penalty must be a number in [0.01, 100], got {self.repetition_penalty!r}")
        bias = dict(self.logit_bias or {})
        for token, value in bias.items():
            if not _is_int(token) or token < 0:
                raise ValueError(f"logit_bias keys must be non-negative token ids, got {token!r}")
            if not _is_number(value) or not -100.0 <= value <= 100.0:
                raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {value!r} for {token}")
        self.logit_bias = bias or None

    @property
    def stop_strings(self) -> list[str]:
        return self._stop

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
