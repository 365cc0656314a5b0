"""Paged KV cache and attention over a packed batch.

Every scheduled sequence contributes q_len query tokens whose K/V are written into its cache blocks first; each query
then attends to all of its sequence's cached tokens up to and including its own position.

Three backends (`build_metadata(backend=...)`, chosen by engine.ops.Ops.attention):
- "kernel" (the CPU): sequences with short queries (decodes and verify segments) are attended together by a C++
  kernel that reads the blocks in place (engine/csrc); longer prefill chunks one by one with SDPA, causally.
- "flex" (the GPU): every packed token in one `flex_attention` call over the whole cache seen as one long sequence,
  read in place. A block mask lists, for each group of FLEX_Q_BLOCK packed tokens, the cache blocks its sequences
  may read, and a mask_mod maps a physical key back to its sequence's position (docs/design.md, "Attention").
- "sdpa" (the fallback): short queries by one SDPA call over their gathered blocks, with the query heads that share
  a KV head folded into the query axis so grouped-query attention needs no K/V repeat; prefill chunks as above.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.device_io import to_device

SMALL_QUERY = 16  # sequences with at most this many new tokens go to the batched path
FLEX_Q_BLOCK = 16  # packed tokens per row of the flex block mask: a decode batch's rows share one list of blocks
BACKENDS = ("kernel", "flex", "sdpa")


class KVCache:
    """Per-layer K and V tensors. V is [num_blocks, block_size, num_kv_heads, head_dim]. K has the same layout
    ("plain"), or for the CPU kernel [num_blocks, num_kv_heads, head_dim, block_size] ("transposed") or, in bf16 on a
    CPU with AVX512-BF16, [num_blocks, num_kv_heads, head_dim / 2, block_size, 2] ("paired": see
    engine/csrc/cpu_kernels.cpp)."""

    def __init__(self, num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, device,
                 k_layout: str = "plain"):
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        k_shape = {"plain": shape, "transposed": (num_blocks, num_kv_heads, head_dim, block_size),
                   "paired": (num_blocks, num_kv_heads, head_dim // 2, block_size, 2)}[k_layout]
        # Zeroed: masked-out slots are multiplied by 0 in attention, and garbage could hold NaN.
        self.k = [torch.zeros(k_shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_blocks, self.block_size = num_blocks, block_size

    @staticmethod
    def bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype) -> int:
        return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8



@dataclass
class SmallGroup:
    num_seqs: int
    max_q: int
    num_tokens: int
    # For the kernel: query offsets, cached lengths (new tokens included) and block tables.
    cu_q: torch.Tensor | None = None  # [B + 1]
    ctx_len: torch.Tensor | None = None  # [B]
    block_tables: torch.Tensor | None = None  # [B, max_blocks]
    # For SDPA over gathered blocks.
    num_blocks: int = 0
    block_ids: torch.Tensor | None = None  # [B * num_blocks]
    mask: torch.Tensor | None = None  # [B, 1, G * max_q, num_blocks * block_size], True = attend
    pad_rows: torch.Tensor | None = None  # row of each packed token in the padded [B * max_q] layout


@dataclass
class PrefillChunk:
    start: int  # first row in the packed batch
    q_len: int
    ctx_start: int  # tokens already cached before this chunk
    block_ids: torch.Tensor  # blocks holding tokens 0 .. ctx_start + q_len
    mask: torch.Tensor | None  # None when ctx_start == 0 (plain causal)


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] cache slot of every packed token
    small: SmallGroup | None
    prefills: list[PrefillChunk]
    k_transposed: bool  # K cache layout of the CPU kernel
    causal: bool = True  # False: every query of a segment sees all of its sequence's keys (the drafter's blocks)
    flex: object | None = None  # the "flex" backend's BlockMask: then `small` is None and `prefills` empty


def build_metadata(seqs: list[tuple[int, int, list[int]]], block_size: int, q_per_kv: int, device: torch.device,
                   backend: str, causal: bool = True, small_query: int = SMALL_QUERY,
                   num_cache_blocks: int | None = None) -> AttentionMetadata:
    """seqs: (q_len, num_cached_before, block_table) per sequence, in packed order, short queries first (the "flex"
    backend takes any order). `backend`: one of BACKENDS. `causal=False` (all sequences go to the small group):
    each segment's queries see all of its keys, as the drafter's block attends to itself. `small_query`: the longest
    query of the small group (DecoderLM.small_query). `num_cache_blocks`: the cache's size, which "flex" needs."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}: expected one of {BACKENDS}")
    slots: list[int] = []
    for q_len, start, table in seqs:
        for pos in range(start, start + q_len):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
    slot_mapping = to_device(torch.tensor(slots, dtype=torch.long), device)
    if backend == "flex":
        if num_cache_blocks is None:
            raise ValueError("the flex backend needs num_cache_blocks")
        mask = _flex_block_mask(seqs, block_size, num_cache_blocks, device, causal)
        return AttentionMetadata(slot_mapping, None, [], k_transposed=False, causal=causal, flex=mask)
    fused = backend == "kernel"
    n_small = sum(1 for s in seqs if s[0] <= small_query) if causal else len(seqs)
    assert all(s[0] <= small_query for s in seqs[:n_small]), "short queries must come first"
    small = seqs[:n_small]
    group = None
    if small:
        group = (_kernel_group(small, block_size, device) if fused
                 else _sdpa_group(small, block_size, q_per_kv, device, causal))
    prefills = []
    row = sum(s[0] for s in small)
    for q_len, start, table in seqs[n_small:]:
        nb = (start + q_len + block_size - 1) // block_size
        mask = None
        if start:
            keys = torch.arange(nb * block_size)
            mask = to_device((keys[None, :] <= start + torch.arange(q_len)[:, None])[None, None], device)
        prefills.append(PrefillChunk(row, q_len, start, to_device(torch.tensor(table[:nb]), device), mask))
        row += q_len
    return AttentionMetadata(slot_mapping, group, prefills, k_transposed=fused,
                             causal=causal)


def _flex_block_mask(seqs, block_size: int, num_cache_blocks: int, device: torch.device, causal: bool):
    """The BlockMask of one flex_attention call over every packed token (T) and the whole cache seen as one sequence
    of num_cache_blocks * block_size keys. Row r of the mask lists the cache blocks that tokens r * FLEX_Q_BLOCK ..
    (r + 1) * FLEX_Q_BLOCK - 1 may read: the blocks of each sequence with tokens there, up to the block of the last
    key those tokens see, each block once (prefix-cached blocks are shared). The mask_mod then keeps, for each token,
    the keys of its own sequence up to its limit: a physical key's block is mapped back to its position in the
    sequence through a [sequences, cache blocks] table scattered on the device from the block tables."""
    from torch.nn.attention.flex_attention import BlockMask

    doc: list[int] = []  # the sequence of each packed token
    limit: list[int] = []  # the last position each token sees
    spans = []  # (first token, last token + 1, table) per sequence
    for i, (q_len, start, table) in enumerate(seqs):
        spans.append((len(doc), len(doc) + q_len, table))
        doc += [i] * q_len
        limit += range(start, start + q_len) if causal else [start + q_len - 1] * q_len
    T, Q = len(doc), FLEX_Q_BLOCK
    rows: list[list[int]] = []
    s = 0
    for lo in range(0, T, Q):
        hi = min(T, lo + Q)
        while spans[s][1] <= lo:
            s += 1
        blocks: dict[int, None] = {}
        j = s
        while j < len(spans) and spans[j][0] < hi:
            _, end, table = spans[j]
            last_key = limit[min(end, hi) - 1]  # limits grow along a sequence's tokens
            blocks.update(dict.fromkeys(table[: last_key // block_size + 1]))
            j += 1
        rows.append(list(blocks))
    width = max(len(r) for r in rows)
    listed = to_device(torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32), device)
    # Rows as wide as the cache, as compiled flex_attention wants them; filled on the device (a few KB a row there).
    kv_indices = torch.zeros((len(rows), num_cache_blocks), dtype=torch.int32, device=device)
    kv_indices[:, :width] = listed
    kv_num_blocks = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    # [sequences, max blocks] padded with a spare column num_cache_blocks, which the scatter fills and we drop.
    max_blocks = max(len(t) for _, _, t in spans)
    tables = torch.tensor([t + [num_cache_blocks] * (max_blocks - len(t)) for _, _, t in spans], dtype=torch.long)
    tables = to_device(tables, device)
    logical = torch.arange(max_blocks, device=device).expand(len(spans), max_blocks)
    to_logical = torch.full((len(spans), num_cache_blocks + 1), -1, dtype=torch.long, device=device)
    to_logical = to_logical.scatter_(1, tables, logical)[:, :num_cache_blocks]
    doc_t = to_device(torch.tensor(doc, dtype=torch.long), device)
    limit_t = to_device(torch.tensor(limit, dtype=torch.long), device)

    def mask_mod(b, h, q_idx, kv_idx):
        block = to_logical[doc_t[q_idx], kv_idx // block_size]
        return (block >= 0) & (block * block_size + kv_idx % block_size <= limit_t[q_idx])

    return BlockMask.from_kv_blocks(to_device(kv_num_blocks, device)[None, None], kv_indices[None, None],
                                    BLOCK_SIZE=(Q, block_size),
                                    mask_mod=mask_mod, seq_lengths=(T, num_cache_blocks * block_size),
                                    compute_q_blocks=False)


@functools.cache
def _flex_attention(compiled: bool):
    """flex_attention, compiled for a GPU (eager, it would score every key of the cache); eager on the CPU, where
    the "flex" backend runs only to test it against the others."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, fullgraph=True, dynamic=True) if compiled else flex_attention


@functools.cache
def flex_unavailable(device_type: str) -> str | None:
    """Why the flex backend cannot run on this kind of device (None where it can): one small mixed batch through it
    (compiled on a GPU) must match the SDPA path. Checked once per process; the engine falls back to SDPA."""
    device = torch.device(device_type)
    try:
        gen = torch.Generator().manual_seed(0)
        bs, nblocks, H, Hkv, D = 16, 6, 4, 2, 16
        k_cache, v_cache = (torch.randn(nblocks, bs, Hkv, D, generator=gen).to(device) for _ in range(2))
        seqs = [(1, 20, [4, 1]), (3, 9, [0]), (20, 0, [2, 5])]  # a decode, a verify segment, a prefill
        q = torch.randn(sum(n for n, _, _ in seqs), H, D, generator=gen).to(device)
        flex = build_metadata(seqs, bs, H // Hkv, device, backend="flex", num_cache_blocks=nblocks)
        sdpa = build_metadata(seqs, bs, H // Hkv, device, backend="sdpa")
        got, want = (paged_attention(q, k_cache, v_cache, m, D ** -0.5) for m in (flex, sdpa))
        if not torch.allclose(got, want, rtol=1e-3, atol=1e-3):
            return f"flex_attention disagrees with SDPA by {(got - want).abs().max().item():.3g}"
    except Exception as exc:  # an old torch, no Triton, a kernel that does not build: SDPA still serves
        return f"flex_attention failed: {exc!r}"
    return None


def _flex(q, k_cache, v_cache, block_mask, scale) -> torch.Tensor:
    """q [T, H, D] against the plain cache [N, block_size, Hkv, D], viewed in place as [1, Hkv, N * block_size, D]."""
    T, H, D = q.shape
    N, bs, Hkv, _ = v_cache.shape
    k = k_cache.view(1, N * bs, Hkv, D).transpose(1, 2)
    v = v_cache.view(1, N * bs, Hkv, D).transpose(1, 2)
    # The kernel's tiles are the mask's blocks (16 packed tokens by one cache block), as the lists assume.
    options = {"BLOCK_M": FLEX_Q_BLOCK, "BLOCK_N": bs, "FORCE_USE_FLEX_ATTENTION": True} if q.is_cuda else None
    o = _flex_attention(q.is_cuda)(q.transpose(0, 1)[None], k, v, block_mask=block_mask, scale=scale,
                                   enable_gqa=Hkv != H, kernel_options=options)
    return o[0].transpose(0, 1).reshape(T, H * D)


def _kernel_group(seqs, block_size, device) -> SmallGroup:
    B = len(seqs)
    used = [(start + q + block_size - 1) // block_size for q, start, _ in seqs]
    max_blocks = max(used)
    # One tensor from padded lists: a torch.tensor per row costs a Python call per sequence, every step.
    tables = torch.tensor([table[:n] + [0] * (max_blocks - n) for (_, _, table), n in zip(seqs, used)],
                          dtype=torch.long)
    q_lens = [q for q, _, _ in seqs]
    cu_q = torch.tensor([0] + q_lens).cumsum(0)
    ctx_len = torch.tensor([start + q for q, start, _ in seqs])
    return SmallGroup(B, max(q_lens), sum(q_lens), cu_q=cu_q, ctx_len=ctx_len, block_tables=tables)


def _sdpa_group(seqs, block_size, q_per_kv, device, causal: bool = True) -> SmallGroup:
    B = len(seqs)
    max_q = max(q for q, _, _ in seqs)
    nb = max((start + q + block_size - 1) // block_size for q, start, _ in seqs)
    block_ids = torch.zeros(B, nb, dtype=torch.long)
    lim = torch.full((B, max_q), -1, dtype=torch.long)  # key j visible to query i iff j <= lim[b, i]
    pad_rows = []
    for b, (q_len, start, table) in enumerate(seqs):
        n = (start + q_len + block_size - 1) // block_size
        block_ids[b, :n] = torch.tensor(table[:n])
        lim[b, :q_len] = start + (torch.arange(q_len) if causal else q_len - 1)
        lim[b, q_len:] = 0  # padded queries look at one key so softmax stays finite
        pad_rows.extend(range(b * max_q, b * max_q + q_len))
    keys = torch.arange(nb * block_size)
    mask = keys[None, None, :] <= lim[:, :, None]  # [B, max_q, L]
    mask = mask[:, None].repeat(1, 1, q_per_kv, 1)  # row g * max_q + i, matching the folded query layout
    uniform = all(q == max_q for q, _, _ in seqs)
    return SmallGroup(
        B, max_q, sum(q for q, _, _ in seqs), num_blocks=nb, block_ids=to_device(block_ids.flatten(), device),
        mask=to_device(mask, device),
        pad_rows=None if uniform else to_device(torch.tensor(pad_rows, dtype=torch.long), device),
    )


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float, kernels=None) -> torch.Tensor:
    """q [T, H, D]; every token's K/V is already in the cache. Returns [T, H * D]."""
    if meta.flex is not None:
        return _flex(q, k_cache, v_cache, meta.flex, scale)
    T, H, D = q.shape
    Hkv = v_cache.shape[2]
    outs = []
    g = meta.small
    if g is not None:
        q_small = q[: g.num_tokens]
        if g.cu_q is not None:
            outs.append(kernels.paged_attention(q_small, k_cache, v_cache, g.cu_q, g.ctx_len, g.block_tables, scale,
                                                meta.causal))
        else:
            outs.append(_sdpa_small(q_small, k_cache, v_cache, g, H, Hkv, D, scale))
    for p in meta.prefills:
        qp = q[p.start: p.start + p.q_len].transpose(0, 1)[None]  # [1, H, n, D]
        kp, vp = gather_kv(k_cache, v_cache, p.block_ids, 1, meta.k_transposed)
        if p.mask is None:
            n = p.q_len
            o = F.scaled_dot_product_attention(qp, kp[:, :, :n], vp[:, :, :n], is_causal=True, scale=scale,
                                               enable_gqa=True)
        else:
            o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=p.mask, scale=scale, enable_gqa=True)
        outs.append(o[0].transpose(0, 1).reshape(p.q_len, H * D))
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _sdpa_small(q, k_cache, v_cache, g: SmallGroup, H, Hkv, D, scale) -> torch.Tensor:
    B, Lq, G = g.num_seqs, g.max_q, H // Hkv
    if g.pad_rows is not None:
        q = q.new_zeros(B * Lq, H, D).index_copy_(0, g.pad_rows, q)
    qg = q.reshape(B, Lq, Hkv, G, D).permute(0, 2, 3, 1, 4).reshape(B, Hkv, G * Lq, D)
    kg, vg = gather_kv(k_cache, v_cache, g.block_ids, B, False)
    o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask, scale=scale)  # [B, Hkv, G*Lq, D]
    o = o.view(B, Hkv, G, Lq, D).permute(0, 3, 1, 2, 4).reshape(B * Lq, H * D)
    return o if g.pad_rows is None else o.index_select(0, g.pad_rows)


def gather_kv(k_cache, v_cache, block_ids, batch, k_transposed) -> tuple[torch.Tensor, torch.Tensor]:
    """The blocks `block_ids` ([batch * n]) as K and V of shape [batch, Hkv, n * block_size, D]."""
    nb, bs, Hkv, D = block_ids.numel() // batch, v_cache.shape[1], v_cache.shape[2], v_cache.shape[3]
    v = v_cache.index_select(0, block_ids).view(batch, nb * bs, Hkv, D).transpose(1, 2)
    k = k_cache.index_select(0, block_ids)
    if k.dim() == 5:  # paired
        k = k.view(batch, nb, Hkv, D // 2, bs, 2).permute(0, 2, 1, 4, 3, 5).reshape(batch, Hkv, nb * bs, D)
    elif k_transposed:
        k = k.view(batch, nb, Hkv, D, bs).permute(0, 2, 1, 4, 3).reshape(batch, Hkv, nb * bs, D)
    else:
        k = k.view(batch, nb * bs, Hkv, D).transpose(1, 2)
    return k, v
