"""Lossless acceptance of verified drafts, per sequence. The greedy and random paths sit side by side.

Greedy: accept the drafts that equal the target's argmax, then emit the target's own token at the first mismatch
(or after the last draft).

Random (speculative sampling): accept draft x_k with probability min(1, p_t(x_k) / p_d(x_k)); at the first
rejection emit a sample of norm(max(p_t - p_d, 0)); if every draft is accepted, emit a bonus sample of p_t at the
next position. p_t is the target distribution after the request's temperature, top-k and top-p, p_d the drafter's
distribution the draft was drawn from. The emitted tokens are then distributed exactly as plain sampling from p_t.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sampler import SamplingBatch, sample_from_probs, target_probs


@dataclass
class VerifyResult:
    tokens: list[list[int]]  # per sequence: accepted drafts followed by one target token
    num_accepted: list[int]


def verify_greedy(logits: torch.Tensor, drafts: list[list[int]], argmax=None) -> VerifyResult:
    """logits: [sum(k_i + 1), V], rows of sequence i in order. drafts[i]: its k_i draft tokens."""
    best = (argmax or (lambda x: x.argmax(-1)))(logits).tolist()
    tokens, accepted, row = [], [], 0
    for d in drafts:
        a = 0
        while a < len(d) and d[a] == best[row + a]:
            a += 1
        tokens.append(d[:a] + [best[row + a]])
        accepted.append(a)
        row += len(d) + 1
    return VerifyResult(tokens, accepted)


def verify_random(logits: torch.Tensor, drafts: list[list[int]], draft_probs: list[torch.Tensor], params_list,
                  generators: list[torch.Generator | None], default: torch.Generator | None) -> VerifyResult:
    """logits: [sum(k_i + 1), V]; draft_probs[i]: [k_i, V] full-vocabulary p_d of sequence i's drafts."""
    device = logits.device
    counts = [len(d) + 1 for d in drafts]
    row_params = [p for p, n in zip(params_list, counts) for _ in range(n)]
    row_gens = [g for g, n in zip(generators, counts) for _ in range(n)]
    p_t = target_probs(logits.float(), SamplingBatch.build(row_params, row_gens, device))
    tokens, accepted, row = [], [], 0
    for i, d in enumerate(drafts):
        k, g = len(d), generators[i]
        a = k
        if k:
            x = torch.tensor(d, device=device)
            pt = p_t[row: row + k].gather(1, x[:, None])[:, 0]
            pd = draft_probs[i].to(device=device, dtype=p_t.dtype).gather(1, x[:, None])[:, 0]
            u = torch.rand(k, device=device, generator=g if g is not None else default)
            rejected = (u * pd > pt).nonzero()
            a = int(rejected[0, 0]) if len(rejected) else k
        if a < k:
            residual = (p_t[row + a] - draft_probs[i][a].to(device=device, dtype=p_t.dtype)).clamp(min=0)
            dist = residual if residual.sum() > 0 else p_t[row + a]
        else:
            dist = p_t[row + k]
        tokens.append(d[:a] + [int(sample_from_probs(dist[None], [g], default)[0])])
        accepted.append(a)
        row += k + 1
    return VerifyResult(tokens, accepted)
