"""Per-sequence draft contexts on one shared drafter, and batched proposals.

A context is what DeepSpec keeps in its draft DynamicCache between rounds: for every
draft layer, the K/V of the context tokens (k_norm + rope already applied). Nothing
else is needed, so that is all we store. Block K/V are recomputed every round and
never stored.

Storage is one preallocated arena of fixed-size pages, [slots, L, 2, n_kv, hd]:
memory is bounded by construction, accounted per page, and freed pages are reused.
propose() gathers the batch's contexts into a padded [B, T_max] view with one
index op, then runs one backbone pass and one Markov loop for the whole batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch

from .model import DraftProposal, DSparkDrafter


class ContextPoolFull(RuntimeError):
    """Raised when an append would exceed the pool's memory budget (nothing is written)."""


@dataclass
class DraftRequest:
    handle: int
    anchor_token: int  # x_0: last token emitted by the target (bonus/corrected token)
    anchor_pos: int  # its absolute position; the context must hold positions < anchor_pos
    temperature: float = 0.0  # 0 = greedy
    generator: torch.Generator | None = None  # per-sequence RNG for sampling (on the pool's device)


@dataclass
class _Context:
    pages: list[int] = field(default_factory=list)
    length: int = 0


class DraftContextPool:
    def __init__(self, model: DSparkDrafter, max_tokens: int | None = None, *,
                 max_bytes: int | None = None, page_size: int = 16):
        if (max_tokens is None) == (max_bytes is None):
            raise ValueError("give exactly one of max_tokens / max_bytes")
        cfg = model.config
        self.model = model
        self.page_size = page_size
        self.token_shape = (cfg.num_hidden_layers, 2, cfg.num_key_value_heads, cfg.head_dim)
        self.token_bytes = math.prod(self.token_shape) * model.dtype.itemsize
        self.page_bytes = page_size * self.token_bytes
        # A token budget is rounded up to whole pages; a byte budget is never exceeded.
        n_pages = math.ceil(max_tokens / page_size) if max_tokens is not None else max_bytes // self.page_bytes
        if n_pages < 1:
            raise ValueError("budget is smaller than one page")
        # Zeroed: padding reads unused slots, and masked-out garbage could be NaN (0 * NaN = NaN in attention).
        self._kv = torch.zeros(n_pages * page_size, *self.token_shape, dtype=model.dtype, device=model.device)
        self._free = list(range(n_pages - 1, -1, -1))  # stack of free page ids
        self._ctxs: dict[int, _Context] = {}
        self._next_handle = 0

    # -- accounting ------------------------------------------------------------
    @property
    def num_pages(self) -> int:
        return self._kv.shape[0] // self.page_size

    @property
    def capacity_bytes(self) -> int:
        return self.num_pages * self.page_bytes

    @property
    def bytes_in_use(self) -> int:
        return (self.num_pages - len(self._free)) * self.page_bytes

    @property
    def free_tokens(self) -> int:
        return len(self._free) * self.page_size

    @property
    def num_live_contexts(self) -> int:
        return len(self._ctxs)

    def length(self, handle: int) -> int:
        return self._get(handle).length

    # -- lifecycle -------------------------------------------------------------
    def create_context(self) -> int:
        h = self._next_handle
        self._next_handle += 1
        self._ctxs[h] = _Context()
        return h

    def release(self, handle: int) -> None:
        ctx = self._ctxs.pop(handle)
        self._free.extend(reversed(ctx.pages))

    def truncate(self, handle: int, length: int) -> None:
        """Keep the first `length` context tokens (e.g. drop tokens the target rejected)."""
        ctx = self._get(handle)
        if not 0 <= length <= ctx.length:
            raise ValueError(f"truncate({length}) outside [0, {ctx.length}]")
        keep = math.ceil(length / self.page_size)
        self._free.extend(reversed(ctx.pages[keep:]))
        del ctx.pages[keep:]
        ctx.length = length

    def append(self, handle: int, taps: torch.Tensor, positions: torch.Tensor) -> None:
        """Add context tokens: raw taps [n, n_taps*d_target] at absolute positions [n]."""
        self.append_many([(handle, taps, positions)])

    @torch.no_grad()
    def append_many(self, items: Iterable[tuple[int, torch.Tensor, torch.Tensor]]) -> None:
        """append() for several sequences with a single projection pass. All-or-nothing on budget."""
        items = [(h, t, p) for h, t, p in items if t.shape[0] > 0]
        if not items:
            return
        cfg, P = self.model.config, self.page_size
        width = cfg.num_taps * cfg.hidden_size
        new_len: dict[int, int] = {}
        for h, taps, pos in items:
            if taps.ndim != 2 or taps.shape[1] != width or pos.shape != (taps.shape[0],):
                raise ValueError(f"taps must be [n, {width}] with positions [n]; got {tuple(taps.shape)}, {tuple(pos.shape)}")
            if pos.device.type == "cpu" and int(pos.max()) >= cfg.max_position_embeddings:
                raise ValueError(f"position >= max_position_embeddings ({cfg.max_position_embeddings})")
            new_len[h] = new_len.get(h, self._get(h).length) + taps.shape[0]
        need = sum(math.ceil(n / P) - len(self._ctxs[h].pages) for h, n in new_len.items())
        if need > len(self._free):
            raise ContextPoolFull(
                f"draft context pool full: need {need} more pages of {P} tokens, {len(self._free)} free "
                f"(capacity {self.capacity_bytes} B, in use {self.bytes_in_use} B); release or truncate contexts")
        slots = []
        for h, taps, _ in items:
            ctx = self._ctxs[h]
            n = taps.shape[0]
            while len(ctx.pages) * P < ctx.length + n:
                ctx.pages.append(self._free.pop())
            t = torch.arange(ctx.length, ctx.length + n)
            slots.append(torch.tensor(ctx.pages)[t // P] * P + t % P)
            ctx.length += n
        dev = self._kv.device
        taps = torch.cat([t.to(dev) for _, t, _ in items])
        pos = torch.cat([p.to(dev) for _, _, p in items])
        kv = self.model.context_kv(taps, pos)
        self._kv.index_copy_(0, _to_device(torch.cat(slots), dev), kv)

    # -- drafting --------------------------------------------------------------
    @torch.no_grad()
    def propose(self, batch: Sequence[DraftRequest | tuple], probs_format: str = "full") -> DraftProposal:
        """Draft gamma tokens for every request in one backbone pass + one batched Markov loop.

        Items are DraftRequest or tuples (handle, anchor_token, anchor_pos[, temperature[, generator]]).
        probs_format: "full" | "compact" | "none", see DraftProposal.
        """
        reqs = [r if isinstance(r, DraftRequest) else DraftRequest(*r) for r in batch]
        if not reqs:
            raise ValueError("empty batch")
        ctxs = [self._get(r.handle) for r in reqs]
        dev, P, B, G = self._kv.device, self.page_size, len(reqs), self.model.gamma
        T = max(c.length for c in ctxs)
        lens = _to_device(torch.tensor([c.length for c in ctxs]), dev)
        if T > 0:
            n_pages = max(len(c.pages) for c in ctxs)
            table = _to_device(torch.tensor([c.pages + [0] * (n_pages - len(c.pages)) for c in ctxs]), dev)
            t = torch.arange(T, device=dev)
            ctx_kv = self._kv[table[:, t // P] * P + t % P]  # [B, T, L, 2, n_kv, hd]; pads read page 0
            valid = t[None, :] < lens[:, None]
        else:
            ctx_kv = self._kv.new_empty(B, 0, *self.token_shape)
            valid = torch.zeros(B, 0, dtype=torch.bool, device=dev)
        anchor_ids = _to_device(torch.tensor([r.anchor_token for r in reqs]), dev)
        anchor_pos = _to_device(torch.tensor([r.anchor_pos for r in reqs]), dev)
        h = self.model.block_hidden(ctx_kv, valid, anchor_ids, anchor_pos)

        temperature = uniforms = None
        if any(r.temperature > 1e-5 for r in reqs):
            pdt = self.model.prob_dtype
            temperature = _to_device(torch.tensor([float(r.temperature) for r in reqs], dtype=pdt), dev)
            uniforms = torch.zeros(B, G, dtype=pdt, device=dev)
            shared = [i for i, r in enumerate(reqs) if r.temperature > 1e-5 and r.generator is None]
            if shared:
                uniforms[shared] = torch.rand(len(shared), G, dtype=pdt, device=dev)
            for i, r in enumerate(reqs):
                if r.temperature > 1e-5 and r.generator is not None:
                    uniforms[i] = torch.rand(G, dtype=pdt, device=r.generator.device, generator=r.generator).to(dev)
        return self.model.decode(h, anchor_ids, temperature, uniforms, probs_format=probs_format)

    def _get(self, handle: int) -> _Context:
        try:
            return self._ctxs[handle]
        except KeyError:
            raise KeyError(f"unknown or released draft context handle {handle}") from None


def _to_device(t: torch.Tensor, dev: torch.device) -> torch.Tensor:
    # Host-built index tensors: pinned + non_blocking so CUDA launches don't wait on the copy.
    if dev.type == "cuda":
        return t.pin_memory().to(dev, non_blocking=True)
    return t.to(dev)
