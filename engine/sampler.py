"""Token sampling: greedy, temperature, top-k, top-p, with optional per-request seeds.

Random rows are drawn by inverse CDF: one uniform per row picks the first token whose cumulative mass exceeds it, which
draws exactly from p. (The exponential race, argmax of p / E with E ~ Exp(1), is exact too, but it draws a noise
value for every vocabulary entry, which at a large batch costs more than the forward.) A request with
a seed draws its uniform from its own generator, so its samples do not depend on what else is in the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.device_io import to_device


@dataclass
class SamplingBatch:
    temperature: torch.Tensor  # [N] float32; 0 = greedy
    top_k: torch.Tensor  # [N] long; <= 0 = off
    top_p: torch.Tensor  # [N] float32
    generators: list[torch.Generator | None]
    all_greedy: bool
    any_greedy: bool
    use_top_k: bool
    use_top_p: bool
    top_k_width: int  # the k of the row that keeps most tokens (0: a row keeps the whole vocabulary)

    @classmethod
    def build(cls, params_list, generators, device) -> SamplingBatch:
        temps = [p.temperature for p in params_list]
        top_k = [p.top_k for p in params_list]
        top_p = [p.top_p for p in params_list]
        # Decided on the host from the request parameters: reading them back from the device would wait for it.
        return cls(
            temperature=to_device(torch.tensor(temps, dtype=torch.float32), device),
            top_k=to_device(torch.tensor(top_k, dtype=torch.long), device),
            top_p=to_device(torch.tensor(top_p, dtype=torch.float32), device),
            generators=list(generators),
            all_greedy=all(t == 0.0 for t in temps),
            any_greedy=any(t == 0.0 for t in temps),
            use_top_k=any(k > 0 for k in top_k),
            use_top_p=any(p < 1.0 for p in top_p),
            top_k_width=0 if any(k <= 0 for k in top_k) else max(top_k, default=0),
        )


def target_probs(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """The distribution each row samples from: softmax(logits / T) restricted to top-k and top-p.
    Greedy rows (T = 0) get a one-hot at the argmax, which makes them usable by the rejection rule too."""
    temps = batch.temperature.clamp(min=1e-6).unsqueeze(1)
    logits = logits / temps
    if batch.use_top_k:
        k = torch.where(batch.top_k > 0, batch.top_k, logits.shape[1]).clamp(max=logits.shape[1])
        width = min(batch.top_k_width or logits.shape[1], logits.shape[1])
        kth = logits.topk(width, dim=1).values.gather(1, (k - 1).unsqueeze(1))
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=1)
    if batch.use_top_p:
        sorted_p, order = probs.sort(dim=1, descending=True)
        mass_before = sorted_p.cumsum(dim=1) - sorted_p
        drop = mass_before >= batch.top_p.unsqueeze(1)
        drop[:, 0] = False  # the most likely token always stays (a top_p that underflows float32 would drop all)
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(1, order, sorted_p)
        probs = probs / probs.sum(dim=1, keepdim=True)
    greedy = batch.temperature == 0
    if batch.any_greedy:
        onehot = torch.zeros_like(probs).scatter_(1, logits.argmax(dim=1, keepdim=True), 1.0)
        probs = torch.where(greedy.unsqueeze(1), onehot, probs)
    return probs


def uniform_noise(n: int, generators, device, default: torch.Generator | None) -> torch.Tensor:
    """U[0, 1) per row, float64; row i comes from generators[i] when it has one, else from `default`."""
    u = torch.rand(n, dtype=torch.float64, device=device, generator=default)
    for i, g in enumerate(generators):
        if g is not None:
            u[i] = torch.rand(1, dtype=torch.float64, device=device, generator=g)[0]
    return u


def sample_from_probs(probs: torch.Tensor, generators, default: torch.Generator | None) -> torch.Tensor:
    """One token per row of non-negative weights `probs` [N, V] (normalised or not), by inverse CDF. The target
    point stays below the row's total, so some token's cumulative mass exceeds it, and a token of zero weight
    (whose cumulative mass equals its predecessor's) is never the first to exceed it."""
    cdf = probs.to(torch.float64).cumsum(dim=1)
    total = cdf[:, -1:]
    x = uniform_noise(probs.shape[0], generators, probs.device, default)[:, None] * total
    x = torch.minimum(x, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x, right=True)[:, 0]


def sample(logits: torch.Tensor, batch: SamplingBatch, default: torch.Generator | None = None,
           argmax=None) -> torch.Tensor:
    """logits [N, V] (any float dtype) -> token ids [N]. `argmax`: a faster row-wise argmax, if any."""
    argmax = argmax or (lambda x: x.argmax(dim=1))
    if batch.all_greedy:
        return argmax(logits)
    logits = logits.float()
    tokens = sample_from_probs(target_probs(logits, batch), batch.generators, default)
    greedy = batch.temperature == 0
    return torch.where(greedy, argmax(logits), tokens)
