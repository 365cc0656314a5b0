"""Lossless acceptance of verified drafts. The greedy and random paths sit side by side; each works on the device
for all sequences at once, and the host reads the outcome with the step's other results (engine/device_io.py).

Greedy: accept the drafts that equal the target's argmax, then emit the target's own token at the first mismatch
(or after the last draft).

Random (speculative sampling): accept draft x_k with probability min(1, p_t(x_k) / p_d(x_k)); at the first
rejection emit a sample of norm(max(p_t - p_d, 0)); if every draft is accepted, emit a bonus sample of p_t at the
next position. p_t is the target distribution after the request's temperature, top-k and top-p, p_d the drafter's
distribution the draft was drawn from. The emitted tokens are then distributed exactly as plain sampling from p_t.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch

from engine.device_io import to_device
from engine.sampler import SamplingBatch, sample_from_probs, target_probs


@dataclass
class VerifyResult:
    tokens: list[list[int]]  # per sequence: accepted drafts followed by one target token
    num_accepted: list[int]


def accept_greedy(best: list[int], drafts: list[list[int]]) -> VerifyResult:
    """best: the target's argmax of every verify row (sum(k_i + 1), sequence i's rows in order)."""
    tokens, accepted, row = [], [], 0
    for d in drafts:
        a = 0
        while a < len(d) and d[a] == best[row + a]:
            a += 1
        tokens.append(d[:a] + [best[row + a]])
        accepted.append(a)
        row += len(d) + 1
    return VerifyResult(tokens, accepted)


def residual(p_t: torch.Tensor, p_d: torch.Tensor) -> torch.Tensor:
    """The unnormalised distribution to sample after a rejection: max(p_t - p_d, 0)."""
    return (p_t - p_d).clamp_(min=0)


def verify_random(logits: torch.Tensor, drafts: list[list[int]], draft_probs: list[torch.Tensor], params_list,
                  generators: list[torch.Generator | None],
                  default: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [sum(k_i + 1), V]; draft_probs[i]: [k_i, V] full-vocabulary p_d of sequence i's drafts (k_i >= 1).
    Returns (num_accepted [S], emitted [S]) on the device: sequence i emits drafts[i][:num_accepted[i]], then
    emitted[i]. A sequence with a generator draws its k_i acceptance uniforms, then its sample's, from it."""
    device = logits.device
    k = [len(d) for d in drafts]
    firsts = list(accumulate(k[:-1], initial=0))  # sequence i's first draft among all drafts
    starts = [f + i for i, f in enumerate(firsts)]  # and its first verify row
    k_dev = to_device(torch.tensor(k), device)
    row_params = [p for p, n in zip(params_list, k) for _ in range(n + 1)]
    row_gens = [g for g, n in zip(generators, k) for _ in range(n + 1)]
    p_t = target_probs(logits.float(), SamplingBatch.build(row_params, row_gens, device))
    flat = to_device(torch.tensor([t for d in drafts for t in d]), device)
    draft_rows = to_device(torch.tensor([s + j for s, n in zip(starts, k) for j in range(n)]), device)
    p_d = [to_device(p, device).to(p_t.dtype) for p in draft_probs]
    pt = p_t[draft_rows, flat]
    pd = torch.cat([p.gather(1, flat.narrow(0, f, n)[:, None])[:, 0] for p, f, n in zip(p_d, firsts, k)])
    u = torch.cat([torch.rand(n, device=device, generator=g if g is not None else default)
                   for n, g in zip(k, generators)])
    # First rejection per sequence: pad each sequence's accept flags to K with True, count the leading Trues.
    K = max(k)
    slot = to_device(torch.tensor([i * K + j for i, n in enumerate(k) for j in range(n)]), device)
    accepts = torch.ones(len(k) * K, dtype=torch.bool, device=device).index_put_((slot,), u * pd <= pt)
    num_accepted = accepts.view(len(k), K).long().cumprod(1).sum(1).minimum(k_dev)
    # The next token: from the residual at the first rejected position, or a bonus sample of p_t after the last.
    next_row = to_device(torch.tensor(starts), device) + num_accepted
    p_t_next = p_t[next_row]
    p_d_next = torch.cat([p.index_select(0, a.clamp(max=p.shape[0] - 1)[None])
                          for p, a in zip(p_d, num_accepted.unbind())])
    p_d_next.mul_((num_accepted < k_dev)[:, None])  # none after the last draft
    dist = residual(p_t_next, p_d_next)
    dist = torch.where(dist.sum(1, keepdim=True) > 0, dist, p_t_next)  # p_d = p_t up to rounding: nothing to correct
    return num_accepted, sample_from_probs(dist, generators, default)
