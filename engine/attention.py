"""Paged KV cache and attention over a packed batch.

Every scheduled sequence contributes q_len query tokens whose K/V are written into its cache blocks first; each query
then attends to all of its sequence's cached tokens up to and including its own position.

Sequences with short queries (decodes and verify segments) are attended together: on the CPU by a C++ kernel that
reads the blocks in place (engine/csrc), elsewhere by one SDPA call over their gathered blocks, with the query heads
that share a KV head folded into the query axis so grouped-query attention needs no K/V repeat. Longer prefill
chunks are attended one by one with SDPA, causally.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.device_io import to_device

SMALL_QUERY = 16  # sequences with at most this many new tokens go to the batched path


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


def build_metadata(seqs: list[tuple[int, int, list[int]]], block_size: int, q_per_kv: int, device: torch.device,
                   fused: bool, causal: bool = True, small_query: int = SMALL_QUERY) -> AttentionMetadata:
    """seqs: (q_len, num_cached_before, block_table) per sequence, in packed order, short queries first.
    `fused`: build the small group for the CPU kernel rather than for SDPA. `causal=False` (all sequences go to the
    small group): each segment's queries see all of its keys, as the drafter's block attends to itself.
    `small_query`: the longest query of the small group (DecoderLM.small_query)."""
    slots: list[int] = []
    for q_len, start, table in seqs:
        for pos in range(start, start + q_len):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
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
    slot_mapping = to_device(torch.tensor(slots, dtype=torch.long), device)
    return AttentionMetadata(slot_mapping, group, prefills, k_transposed=fused,
                             causal=causal)


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
