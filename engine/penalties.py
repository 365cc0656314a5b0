"""Logit bias and the repetition, frequency and presence penalties, as vLLM and the OpenAI API define them.

They change the target's distribution itself, so they are applied to the target's logits before anything samples or
verifies: a plain row sees the sequence's tokens so far, and row j of a verify segment sees them plus the segment's
first j drafts, which are exactly the tokens that precede that row's position if those drafts are accepted (and a
row after a rejected draft is never used). Verification then preserves the penalised law like any other.

For a row whose output so far holds token t c_t times:
    logits[t] += logit_bias[t]
    repetition r (prompt and output tokens): logits[t] = logits[t] / r if logits[t] > 0 else logits[t] * r
    logits[t] -= frequency_penalty * c_t + presence_penalty * (c_t > 0)
"""
from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams


def has_penalties(params: SamplingParams) -> bool:
    return bool(params.logit_bias) or params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0 \
        or params.presence_penalty != 0.0


def apply_penalties(logits: torch.Tensor, params: SamplingParams, prompt: list[int], output: list[int],
                    drafts: list[int] = ()) -> None:
    """Penalise `logits` [n, V] in place: row j follows `prompt`, `output` and drafts[:j]."""
    n, vocab = logits.shape
    device = logits.device
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), dtype=torch.long, device=device)
        bias = torch.tensor(list(params.logit_bias.values()), dtype=logits.dtype, device=device)
        logits[:, ids] += bias
    extra = torch.tensor(list(drafts)[: n - 1], dtype=torch.long, device=device)
    # Output counts per row: those of the output so far, plus the drafts before the row.
    counts = torch.bincount(torch.tensor(output, dtype=torch.long, device=device), minlength=vocab)[:vocab]
    counts = counts.expand(n, vocab).clone()
    for j in range(1, n):
        counts[j:, extra[j - 1]] += 1
    if params.repetition_penalty != 1.0:
        seen = counts > 0
        if prompt:
            seen[:, torch.tensor(prompt, dtype=torch.long, device=device)] = True
        r = params.repetition_penalty
        logits.copy_(torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits))
    if params.frequency_penalty != 0.0:
        logits -= params.frequency_penalty * counts.to(logits.dtype)
    if params.presence_penalty != 0.0:
        logits -= params.presence_penalty * (counts > 0).to(logits.dtype)
