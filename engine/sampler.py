"""Token sampling: greedy, temperature, top-k, top-p, with optional per-request seeds.

Random rows use the exponential race (argmax of p / E with E ~ Exp(1)), which draws exactly from p. A request with a
seed draws its noise from its own generator, so its samples do not depend on what else is in the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplingBatch:
    temperature: torch.Tensor  # [N] float32; 0 = greedy
    top_k: torch.Tensor  # [N] long; <= 0 = off
    top_p: torch.Tensor  # [N] float32
    generators: list[torch.Generator | None]
    all_greedy: bool
    use_top_k: bool
    use_top_p: bool

    @classmethod
    def build(cls, params_list, generators, device) -> SamplingBatch:
        temps = [p.temperature for p in params_list]
        top_k = [p.top_k for p in params_list]
        top_p = [p.top_p for p in params_list]
        return cls(
            temperature=torch.tensor(temps, dtype=torch.float32, device=device),
            top_k=torch.tensor(top_k, dtype=torch.long, device=device),
            top_p=torch.tensor(top_p, dtype=torch.float32, device=device),
            generators=list(generators),
            all_greedy=all(t == 0.0 for t in temps),
            use_top_k=any(k > 0 for k in top_k),
            use_top_p=any(p < 1.0 for p in top_p),
        )


def target_probs(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """The distribution each row samples from: softmax(logits / T) restricted to top-k and top-p.
    Greedy rows (T = 0) get a one-hot at the argmax, which makes them usable by the rejection rule too."""
    temps = batch.temperature.clamp(min=1e-6).unsqueeze(1)
    logits = logits / temps
    if batch.use_top_k:
        k = torch.where(batch.top_k > 0, batch.top_k, logits.shape[1]).clamp(max=logits.shape[1])
        kth = logits.topk(int(k.max()), dim=1).values.gather(1, (k - 1).unsqueeze(1))
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=1)
    if batch.use_top_p:
        sorted_p, order = probs.sort(dim=1, descending=True)
        mass_before = sorted_p.cumsum(dim=1) - sorted_p
        sorted_p = sorted_p.masked_fill(mass_before >= batch.top_p.unsqueeze(1), 0.0)
        probs = torch.zeros_like(probs).scatter_(1, order, sorted_p)
        probs = probs / probs.sum(dim=1, keepdim=True)
    greedy = batch.temperature == 0
    if greedy.any():
        onehot = torch.zeros_like(probs).scatter_(1, logits.argmax(dim=1, keepdim=True), 1.0)
        probs = torch.where(greedy.unsqueeze(1), onehot, probs)
    return probs


def exponential_noise(shape: tuple[int, int], generators, device, default: torch.Generator | None) -> torch.Tensor:
    """Exp(1) noise; row i comes from generators[i] when it has one, else from `default`."""
    noise = torch.empty(shape, device=device).exponential_(generator=default)
    for i, g in enumerate(generators):
        if g is not None:
            noise[i].exponential_(generator=g)
    return noise.clamp_(min=1e-20)  # an exact 0 would turn a zero-probability token into 0/0


def sample_from_probs(probs: torch.Tensor, generators, default: torch.Generator | None) -> torch.Tensor:
    noise = exponential_noise(tuple(probs.shape), generators, probs.device, default)
    return (probs / noise).argmax(dim=1)


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
