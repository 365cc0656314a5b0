"""The draft service: the drafter's weights once, plus the draft context of every sequence of one engine.

It is the engine's `Drafter` (engine/drafter.py): one call per step (`step`) brings some contexts up to date
(truncate, append taps) and proposes blocks for a batch of sequences. The same object runs in the engine's process
(loaded through the `dspark.drafters` entry point, `load_for_engine`) or inside a Ray actor (draft_service/actor.py),
so a step costs one round trip either way. Sequences are named by the engine's keys; their contexts are created on
first use and freed by `release`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from draft_service.context import DraftContextPool, DraftRequest
from draft_service.model import DSparkDrafter
from engine import device_io
from engine.drafter import ContextSync, DraftStep, DraftTarget, DraftWork


@dataclass
class DraftService:
    drafter: DSparkDrafter
    max_context_tokens: int
    pool: DraftContextPool = field(init=False)

    def __post_init__(self) -> None:
        self.pool = DraftContextPool(self.drafter, max_tokens=self.max_context_tokens)
        self.handles: dict[str, int] = {}
        self.generators: dict[str, torch.Generator] = {}

    @classmethod
    def load(cls, path, target_embed: torch.Tensor, target_lm_head: torch.Tensor, dtype: torch.dtype,
             device: torch.device, max_context_tokens: int) -> DraftService:
        drafter = DSparkDrafter.from_pretrained(path, target_embed=target_embed, target_lm_head=target_lm_head,
                                                dtype=dtype, device=device)
        return cls(drafter.optimize_for_inference(), max_context_tokens)

    @property
    def gamma(self) -> int:
        return self.drafter.gamma

    @property
    def vocab_size(self) -> int:
        return self.drafter.config.vocab_size

    @property
    def tap_layers(self) -> list[int]:
        return list(self.drafter.config.target_layer_ids)

    @property
    def copy_hint_ngram(self) -> tuple[int, int] | None:
        """The n-gram sizes of the copy hints the drafter reads (config copy_hint_ngram), None if it reads none."""
        ngram = self.drafter.config.copy_hint_ngram
        return None if ngram is None else (ngram[0], ngram[1])

    def context_length(self, key: str) -> int:
        return self.pool.length(self.handles[key]) if key in self.handles else 0

    def step(self, syncs: list[ContextSync], work: list[DraftWork]) -> DraftStep | None:
        t0 = time.perf_counter()
        appends = []
        for s in syncs:
            handle = self.handles.get(s.key)
            if handle is None:
                handle = self.handles[s.key] = self.pool.create_context()
            length = self.pool.length(handle)
            if length < s.keep:  # e.g. a restarted service: the caller must rebuild this context from scratch
                raise RuntimeError(f"draft context {s.key!r} holds {length} tokens, the engine expects {s.keep}")
            if length > s.keep:
                self.pool.truncate(handle, s.keep)
            if s.taps is not None and s.taps.shape[0]:
                start = self.pool.length(handle)
                pos = torch.arange(start, start + s.taps.shape[0])
                appends.append((handle, s.taps.to(self.drafter.device), pos))
        self.pool.append_many(appends)
        appended = time.perf_counter()
        if not work:
            return None
        requests, sampled = [], []
        for i, w in enumerate(work):
            gen = None
            if w.temperature > 0:
                sampled.append(i)
                gen = self.generators.get(w.key)
                if gen is None and w.seed is not None:
                    gen = self.generators[w.key] = torch.Generator(self.drafter.device).manual_seed(w.seed)
            requests.append(DraftRequest(self.handles[w.key], w.anchor_token, w.anchor_pos, w.temperature, gen,
                                         w.hint, w.penalties))
        prop = self.pool.propose(requests, probs_format="compact" if sampled else "none")
        conf = prop.confidence
        if conf is None:
            conf = torch.ones(prop.tokens.shape, device=prop.tokens.device)
        tokens, confidences = device_io.to_host([prop.tokens, conf])  # the round's one wait for the device
        return DraftStep(
            tokens=tokens, confidences=confidences,
            probs=prop.probs[sampled] if sampled else None, sampled=sampled,
            draft_vocab=prop.draft_vocab, seconds=time.perf_counter() - t0, append_seconds=appended - t0,
        )

    def release(self, keys: list[str]) -> None:
        for key in keys:
            handle = self.handles.pop(key, None)
            if handle is not None:
                self.pool.release(handle)
            self.generators.pop(key, None)

    def stats(self) -> dict:
        return {"live_contexts": self.pool.num_live_contexts, "context_bytes": self.pool.bytes_in_use,
                "context_capacity_bytes": self.pool.capacity_bytes}


def load_for_engine(path, target: DraftTarget) -> DraftService:
    """The `dspark.drafters` entry point (pyproject.toml): the drafter in folder `path`, for an engine that loads it
    in its own process, sharing the target's embedding and lm_head."""
    return DraftService.load(path, target.embed, target.lm_head, target.dtype, target.device,
                             target.max_context_tokens)
