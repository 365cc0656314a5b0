"""Logit bias and the repetition, frequency and presence penalties, as vLLM and the OpenAI API define them.

They change the target's distribution itself, so they are applied to the target's logits before anything samples or
verifies: a plain row sees the sequence's tokens so far, and row j of a verify segment sees them plus the segment's
first j drafts, which are exactly the tokens that precede that row's position if those drafts are accepted (and a
row after a rejected draft is never used). Verification then preserves the penalised law like any other.

A drafter that proposes for the unpenalised model proposes exactly what the penalties push down (repeats, above
all), so the engine also hands each drafted sequence's penalties to the drafter (`DraftPenalties`), which applies them
to its own logits before it picks or samples its block. Any proposal keeps verification lossless; this one is simply
closer to the law it is verified against.

For a row whose output so far holds token t c_t times:
    logits[t] += logit_bias[t]
    repetition r (prompt and output tokens): logits[t] = logits[t] / r if logits[t] > 0 else logits[t] * r
    logits[t] -= frequency_penalty * c_t + presence_penalty * (c_t > 0)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.device_io import to_device
from engine.sampling_params import SamplingParams


def has_penalties(params: SamplingParams) -> bool:
    return bool(params.logit_bias) or params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0 \
        or params.presence_penalty != 0.0


@dataclass
class DraftPenalties:
    """A sequence's penalties as a drafter applies them to its block: over the tokens so far (the block's own drafts
    are not counted). Field names are SamplingParams', so `apply_penalties(rows, p, p.prompt, p.output)` applies
    them."""

    output: list[int]
    prompt: list[int]  # empty unless a repetition penalty reads it
    logit_bias: dict[int, float] | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    @classmethod
    def of(cls, params: SamplingParams, prompt: list[int], output: list[int]) -> DraftPenalties | None:
        if not has_penalties(params):
            return None
        return cls(list(output), list(prompt) if params.repetition_penalty != 1.0 else [], params.logit_bias,
                   params.repetition_penalty, params.frequency_penalty, params.presence_penalty)


def apply_penalties(logits: torch.Tensor, params: SamplingParams, prompt: list[int], output: list[int],
                    drafts: list[int] = (), columns: torch.Tensor | None = None) -> None:
    """Penalise `logits` [n, V] in place: row j follows `prompt`, `output` and drafts[:j] (all of `drafts` where it
    holds fewer). `columns` [vocab]: token id -> its column of `logits`, -1 for none (a drafter's draft vocabulary);
    None: column = token id. Only the columns of tokens the penalties touch are read and written."""
    n = logits.shape[0]
    device = logits.device

    def to_columns(ids: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
        """The entries of `ids` that have a column, and those columns."""
        if columns is None:
            return np.arange(len(ids)), to_device(torch.from_numpy(ids), device)
        cols = columns[torch.from_numpy(ids)].numpy() if columns.device.type == "cpu" else \
            columns[torch.from_numpy(ids).to(columns.device)].cpu().numpy()
        keep = np.flatnonzero(cols >= 0)
        return keep, to_device(torch.from_numpy(cols[keep]), device)

    if params.logit_bias:
        keep, cols = to_columns(np.fromiter(params.logit_bias, dtype=np.int64, count=len(params.logit_bias)))
        bias = np.fromiter(params.logit_bias.values(), dtype=np.float64, count=len(params.logit_bias))[keep]
        logits[:, cols] += to_device(torch.from_numpy(bias), device).to(logits.dtype)
    drafts = list(drafts)[: n - 1]
    repetition = params.repetition_penalty != 1.0
    tokens = np.asarray(list(output) + drafts + (list(prompt) if repetition else []), dtype=np.int64)
    if not len(tokens):
        return
    touched, which = np.unique(tokens, return_inverse=True)
    n_out, n_drafts = len(output), len(drafts)
    # Output counts per row over the touched tokens: the output's, plus the drafts before the row.
    counts = np.zeros((n, len(touched)))
    counts[:] = np.bincount(which[:n_out], minlength=len(touched))
    for j in range(n_drafts):
        counts[j + 1:, which[n_out + j]] += 1
    keep, cols = to_columns(touched)
    if not len(keep):
        return
    counts = to_device(torch.from_numpy(counts[:, keep]), device).to(logits.dtype)
    sub = logits[:, cols]
    if repetition:
        in_prompt = np.zeros(len(touched), dtype=bool)
        in_prompt[which[n_out + n_drafts:]] = True
        seen = (counts > 0) | to_device(torch.from_numpy(in_prompt[keep]), device)
        r = params.repetition_penalty
        sub = torch.where(seen, torch.where(sub > 0, sub / r, sub * r), sub)
    sub = sub - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).to(logits.dtype)
    logits[:, cols] = sub
