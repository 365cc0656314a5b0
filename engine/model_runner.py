"""Packs the scheduled sequences into one forward and returns logits and per-sequence taps."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention import KVCache, build_metadata
from engine.device_io import to_device
from engine.model import DecoderLM
from engine.scheduler import ScheduledSeq


@dataclass
class ForwardOutput:
    order: list[ScheduledSeq]  # the scheduled sequences in packed order
    logits: torch.Tensor  # [R, V] float32, rows in `logit_rows` order
    logit_rows: dict[int, tuple[int, int]]  # index in `order` -> (first row in logits, number of rows)
    taps: dict[int, torch.Tensor]  # index in `order` -> [num_query_tokens, tap_width]


class ModelRunner:
    def __init__(self, model: DecoderLM, kv_cache: KVCache, tap_layers: tuple[int, ...]):
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.tap_layers = tap_layers
        self.device = model.device

    def execute(self, scheduled: list[ScheduledSeq]) -> ForwardOutput:
        # Short queries first: they share one batched attention call.
        order = sorted(scheduled, key=lambda s: s.num_query_tokens > self.model.small_query)
        ids: list[int] = []
        positions: list[int] = []
        meta_seqs = []
        rows: list[int] = []
        logit_rows: dict[int, tuple[int, int]] = {}
        for i, s in enumerate(order):
            seq, start = s.seq, s.seq.num_computed_tokens
            q_len = s.num_query_tokens
            ids.extend(seq.token_ids[start: start + s.num_new_tokens])
            ids.extend(s.draft_tokens)
            positions.extend(range(start, start + q_len))
            meta_seqs.append((q_len, start, seq.block_table))
            if s.samples:
                # One row for a plain decode or the end of a prefill; 1 + k rows to verify k drafts.
                n_rows = 1 + len(s.draft_tokens)
                logit_rows[i] = (len(rows), n_rows)
                end = len(ids)
                rows.extend(range(end - n_rows, end))
        dev = self.device
        meta = build_metadata(meta_seqs, self.block_size, self.model.num_heads // self.model.num_kv_heads, dev,
                              backend=self.model.ops.attention, small_query=self.model.small_query,
                              num_cache_blocks=self.kv_cache.num_blocks)
        input_ids = to_device(torch.tensor(ids, dtype=torch.long), dev)
        pos = to_device(torch.tensor(positions, dtype=torch.long), dev)
        hidden, taps = self.model.forward(input_ids, pos, meta, self.kv_cache, self.tap_layers)
        logits = self.model.compute_logits(hidden.index_select(0, to_device(torch.tensor(rows, dtype=torch.long), dev)))
        per_seq_taps = {}
        if taps is not None:
            offset = 0
            for i, s in enumerate(order):
                per_seq_taps[i] = taps[offset: offset + s.num_query_tokens]
                offset += s.num_query_tokens
        return ForwardOutput(order, logits, logit_rows, per_seq_taps)
