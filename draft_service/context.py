"""Per-sequence draft contexts on one shared drafter, and batched proposals.

A context is what DeepSpec keeps in its draft DynamicCache between rounds: for every
draft layer, the K/V of the context tokens (k_norm + rope already applied). Nothing
else is needed, so that is all we store. Block K/V are recomputed every round and
never stored.

Storage is a paged KV cache of preallocated fixed-size pages, one K and one V tensor
per draft layer in the engine's layouts (engine.attention.KVCache): memory is bounded by
construction, accounted per page, and freed pages are reused. propose() runs one backbone
pass for the whole batch in which every layer writes the block's K/V just past each
context (in slots lent for the call) and attends in place, non-causally, with the engine's
paged attention: the CPU kernel, or SDPA over gathered pages elsewhere. Then one Markov
loop for the whole batch. (Gathering the contexts into a padded batch and concatenating
the block to them took a large share of a round at high batch.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch

from engine.attention import KVCache, build_metadata
from engine.device_io import to_device
from engine.ops import Ops
from engine.penalties import DraftPenalties

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
    # Copy hints: prompt lookup's proposal for the tokens at anchor_pos + 1, ... (None or []: none). Read only by a
    # drafter with config.copy_hint_ngram (DSparkDrafter.block_input_ids).
    hint: Sequence[int] | None = None
    penalties: DraftPenalties | None = None  # the request's penalties, applied to the block's logits (decode)


@dataclass
class _Context:
    pages: list[int] = field(default_factory=list)
    length: int = 0


class DraftContextPool:
    def __init__(self, model: DSparkDrafter, max_tokens: int | None = None, *,
                 max_bytes: int | None = None, page_size: int = 16, kernels: bool = True):
        """`kernels=False` keeps the PyTorch attention path (SDPA over gathered pages) where the CPU kernel would
        run; the results agree (tests)."""
        if (max_tokens is None) == (max_bytes is None):
            raise ValueError("give exactly one of max_tokens / max_bytes")
        cfg = model.config
        self.model = model
        self.page_size = page_size
        self.ops = Ops(model.device, page_size, cfg.head_dim, kernels=kernels)
        self.page_bytes = KVCache.bytes_per_block(cfg.num_hidden_layers, page_size, cfg.num_key_value_heads,
                                                  cfg.head_dim, model.dtype)
        self.token_bytes = self.page_bytes // page_size
        # A token budget is rounded up to whole pages; a byte budget is never exceeded.
        n_pages = math.ceil(max_tokens / page_size) if max_tokens is not None else max_bytes // self.page_bytes
        if n_pages < 1:
            raise ValueError("budget is smaller than one page")
        self.cache = KVCache(cfg.num_hidden_layers, n_pages, page_size, cfg.num_key_value_heads, cfg.head_dim,
                             model.dtype, model.device, k_layout=self.ops.key_layout(model.dtype))
        self._free = list(range(n_pages - 1, -1, -1))  # stack of free page ids
        self._ctxs: dict[int, _Context] = {}
        self._next_handle = 0

    # -- accounting ------------------------------------------------------------
    @property
    def num_pages(self) -> int:
        return self.cache.num_blocks

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
        slots: list[int] = []
        for h, taps, _ in items:
            ctx = self._ctxs[h]
            n = taps.shape[0]
            while len(ctx.pages) * P < ctx.length + n:
                ctx.pages.append(self._free.pop())
            pages = ctx.pages
            slots.extend(pages[t // P] * P + t % P for t in range(ctx.length, ctx.length + n))
            ctx.length += n
        dev = self.model.device
        taps = torch.cat([t.to(dev) for _, t, _ in items]) if len(items) > 1 else items[0][1].to(dev)
        pos = torch.cat([p.to(dev) for _, _, p in items]) if len(items) > 1 else items[0][2].to(dev)
        rows = self.model.context_kv_rows(taps)  # [n, L, 2 * n_kv * hd]
        cos, sin = self.model.rope_full(pos)
        slot_t = to_device(torch.tensor(slots), dev)
        cfg = self.model.config
        for i, layer in enumerate(self.model.layers):  # k_norm + rope on K, then both into the pages
            k_norm = layer.self_attn.k_norm
            self.ops.rope_and_cache(rows[:, i], cos, sin, slot_t, self.cache.k[i], self.cache.v[i], 0,
                                    cfg.num_key_value_heads, k_norm.weight, k_norm.weight, k_norm.eps)

    # -- drafting --------------------------------------------------------------
    @torch.no_grad()
    def propose(self, batch: Sequence[DraftRequest | tuple], probs_format: str = "full") -> DraftProposal:
        """Draft gamma tokens for every request in one backbone pass + one batched Markov loop.

        Items are DraftRequest or tuples (handle, anchor_token, anchor_pos[, temperature[, generator[, hint[,
        penalties]]]]).
        probs_format: "full" | "compact" | "none", see DraftProposal.
        """
        reqs = [r if isinstance(r, DraftRequest) else DraftRequest(*r) for r in batch]
        if not reqs:
            raise ValueError("empty batch")
        # A block is written into its context's pages, so one context drafts one block a round; repeats of the
        # same (context, anchor) share a backbone pass (e.g. several samples of one block), and so their hint: the
        # same prefix gives the same lookup.
        hinted = self.model.config.copy_hint_ngram is not None
        G = self.model.gamma
        blocks: dict[tuple[int, int, int], list[int]] = {}  # block -> the hint it reads
        for r in reqs:
            hint = list(r.hint or ())[: G - 1] if hinted else []
            if blocks.setdefault((r.handle, r.anchor_token, r.anchor_pos), hint) != hint:
                raise ValueError("requests for the same block (context, anchor token and position) differ in hint")
        if len({h for h, _, _ in blocks}) < len(blocks):
            raise ValueError("a context can draft only one block per propose call (same anchor token and position)")
        which = list(blocks)
        row_of = {key: i for i, key in enumerate(which)}
        ctxs = [self._get(h) for h, _, _ in which]
        dev, P = self.model.device, self.page_size
        # Each block goes just past its context: the pages it needs beyond the context's are lent for this call.
        lent = [max(0, math.ceil((c.length + G) / P) - len(c.pages)) for c in ctxs]
        if sum(lent) > len(self._free):
            raise ContextPoolFull(f"draft context pool full: a round of {len(which)} blocks needs {sum(lent)} pages for its "
                                  f"block K/V, {len(self._free)} free; release or truncate contexts")
        spare = [self._free.pop() for _ in range(sum(lent))]
        try:
            tables, i = [], 0
            for c, n in zip(ctxs, lent):
                tables.append(c.pages + spare[i: i + n])
                i += n
            meta = build_metadata([(G, c.length, t) for c, t in zip(ctxs, tables)], P,
                                  self.model.config.num_attention_heads // self.model.config.num_key_value_heads,
                                  dev, backend=self.ops.attention, causal=False,
                                  num_cache_blocks=self.cache.num_blocks)
            anchor_ids = to_device(torch.tensor([a for _, a, _ in which]), dev)
            anchor_pos = to_device(torch.tensor([p for _, _, p in which]), dev)
            hints = None
            if G > 1 and any(blocks.values()):  # [blocks, G - 1], -1 where a block has no hint
                hints = to_device(torch.tensor([hint + [-1] * (G - 1 - len(hint)) for hint in blocks.values()]), dev)
            h = self.model.block_hidden_paged(anchor_ids, anchor_pos, meta, self.cache, self.ops, hints)
        finally:
            self._free.extend(reversed(spare))
        B = len(reqs)
        if len(which) < B:
            rows = to_device(torch.tensor([row_of[(r.handle, r.anchor_token, r.anchor_pos)] for r in reqs]), dev)
            h, anchor_ids = h.index_select(0, rows), anchor_ids.index_select(0, rows)

        temperature = uniforms = None
        if any(r.temperature > 1e-5 for r in reqs):
            pdt = self.model.prob_dtype
            temperature = to_device(torch.tensor([float(r.temperature) for r in reqs], dtype=pdt), dev)
            uniforms = torch.zeros(B, G, dtype=pdt, device=dev)
            shared = [i for i, r in enumerate(reqs) if r.temperature > 1e-5 and r.generator is None]
            if shared:
                uniforms[shared] = torch.rand(len(shared), G, dtype=pdt, device=dev)
            for i, r in enumerate(reqs):
                if r.temperature > 1e-5 and r.generator is not None:
                    uniforms[i] = torch.rand(G, dtype=pdt, device=r.generator.device, generator=r.generator).to(dev)
        penalties = [r.penalties for r in reqs] if any(r.penalties is not None for r in reqs) else None
        return self.model.decode(h, anchor_ids, temperature, uniforms, probs_format=probs_format, penalties=penalties)

    def _get(self, handle: int) -> _Context:
        try:
            return self._ctxs[handle]
        except KeyError:
            raise KeyError(f"unknown or released draft context handle {handle}") from None
