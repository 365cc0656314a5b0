"""How many draft tokens each sequence verifies this step. Pure Python over plain numbers: no tensors, no model.

Adaptive mode is Algorithm 1 of the DSpark paper (the hardware-aware prefix scheduler): rank every (sequence,
position) pair by its prefix survival a_{r,j} = prod_{i<=j} c_{r,i}, admit pairs in that order while the expected
throughput tau * SPS(B) still grows, and stop at the first pair that does not raise it. The early stop keeps the
rule lossless under sampling: whether position j is verified depends on c_1..c_j, which depend on the drafts before
j but never on draft j itself (a search that looks further ahead leaks x_j into its own admission; see
tests/engine/test_verify_length.py for the paper's Appendix-A example).

Beyond the paper: the confidences are corrected online by the acceptance each sequence actually showed per position
(engine/acceptance.py), and an optional per-request latency target caps a request's verify length (`latency_cap`).
The step's cost includes the KV its sequences read. Requests waiting for admission count as sequences that emit one
token per step and gain nothing from verifies: a longer step delays them too, so every extra verify token must add
more the longer the queue, and a longer queue never lengthens a verify. Whether to run a draft round at all is
engine/draft_gate.py's call.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.acceptance import survival
from engine.spec_mode import SpecMode
from engine.step_cost import StepCostModel


@dataclass
class Candidate:
    """One decoding sequence that may verify drafts this step."""

    key: object
    confidences: list[float]  # calibrated c_1..c_gamma
    mode: SpecMode
    cap: int  # most drafts it may verify (tokens left, latency target)


def choose_verify_lengths(cands: list[Candidate], base_tokens: int, num_decoding: int, cost: StepCostModel,
                          budget: int, corrected: dict | None = None, drafted: int | None = None,
                          waiting: int = 0, kv_tokens: int = 0) -> dict:
    """Verify length per candidate key. `base_tokens`: tokens this step runs without drafts (prefill chunks and one
    per decoding sequence); `num_decoding`: sequences that emit a token this step; `budget`: the token budget;
    `corrected`: key -> confidences after the online correction, used by adaptive candidates; `drafted`: sequences
    the draft round ran for (default: every candidate; blocks copied by prompt lookup need no round); `waiting`:
    requests waiting for admission; `kv_tokens`: cached tokens the step's sequences read."""
    lengths: dict = {}
    tokens, tau = base_tokens, float(num_decoding)
    adaptive: list[tuple[float, int, object]] = []
    for c in cands:
        # Only the adaptive policy uses the online correction; threshold:C means the calibrated confidences.
        conf = corrected.get(c.key, c.confidences) if corrected and c.mode.kind == "adaptive" else c.confidences
        cap = max(0, min(c.cap, len(conf)))
        if c.mode.kind == "fixed":
            n = min(c.mode.k, cap)
        elif c.mode.kind == "threshold":
            n = 0
            while n < cap and conf[n] >= c.mode.threshold:
                n += 1
        elif c.mode.kind == "adaptive":
            for j, a in enumerate(survival(conf[:cap])):
                adaptive.append((a, j + 1, c.key))
            n = 0
        else:
            n = 0
        n = min(n, max(0, budget - tokens))
        lengths[c.key] = n
        tokens += n
        tau += sum(survival(conf[:n]))
    # Algorithm 1: by survival, highest first (ties: earlier position first, so prefixes stay prefixes).
    adaptive.sort(key=lambda t: (-t[0], t[1]))
    drafted = len(cands) if drafted is None else drafted
    queue = float(waiting)  # each waiting request: one token per step forgone while a longer step delays it
    best = (tau + queue) * cost.sps(tokens, drafted, kv_tokens)
    for a, j, key in adaptive:
        if a <= 0.0 or tokens + 1 > budget or lengths[key] != j - 1:
            break
        theta = (tau + queue + a) * cost.sps(tokens + 1, drafted, kv_tokens)
        if theta <= best:
            break  # early stop: the first pair that does not raise throughput ends the admission
        best, tau, tokens = theta, tau + a, tokens + 1
        lengths[key] = j
    return lengths


def latency_cap(target_tpot_s: float | None, cost: StepCostModel, tokens: int, drafted_seqs: int,
                gamma: int, kv_tokens: int = 0) -> int:
    """Most drafts a request may add to a step of `tokens` tokens (reading `kv_tokens` cached tokens) so that the
    step, and so the wait for its next token, stays within its latency target (0 when even a plain step is slower)."""
    if target_tpot_s is None:
        return gamma
    n = gamma
    while n > 0 and cost.step_seconds(tokens + n, drafted_seqs, kv_tokens) > target_tpot_s:
        n -= 1
    return n
