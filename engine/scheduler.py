"""Decides what each step computes: decodes of running sequences, then chunks of waiting prompts.

Running sequences go first, in arrival order. A sequence that cannot get a KV block preempts the newest running one,
which drops its cache and is recomputed later from its tokens, so nothing is lost. Waiting prompts are admitted
while the token budget, the sequence limit and the free blocks (above a small watermark) allow; with prefix
caching, an admitted sequence starts after the leading blocks of its tokens that the cache holds.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.block_manager import BlockManager
from engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # known tokens to compute: token_ids[num_computed : num_computed + num_new_tokens]
    draft_tokens: list[int] = field(default_factory=list)  # speculative tokens verified after them

    @property
    def num_query_tokens(self) -> int:
        return self.num_new_tokens + len(self.draft_tokens)

    @property
    def samples(self) -> bool:
        """True when this step computes the sequence's last known token, so the next token comes out."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq]
    preempted: list[Sequence]
    cache_hits: list[Sequence] = field(default_factory=list)  # admitted with leading blocks from the prefix cache

    @property
    def num_tokens(self) -> int:
        return sum(s.num_query_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.blocks = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.watermark = max(1, block_manager.num_blocks // 100)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.cache_queries = 0  # tokens of admitted sequences looked up in the prefix cache
        self.cache_hits = 0  # of them, found there

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        preempted: list[Sequence] = []
        cache_hits: list[Sequence] = []
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.blocks.allocate(seq, seq.num_computed_tokens + n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                scheduled.append(ScheduledSeq(seq, n))
                budget -= n
                i += 1
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not preempted:
            seq = self.waiting[0]
            hits = self.blocks.match_prefix(seq)  # cached leading blocks: taken by reference, not computed
            computed = len(hits) * self.blocks.block_size if hits else seq.num_computed_tokens
            n = min(seq.num_tokens - computed, budget)
            need = self.blocks.blocks_for(computed + n) - len(hits) - len(seq.block_table)
            if need + self.blocks.blocks_taken_from_free(hits) + self.watermark > self.blocks.num_free:
                break
            if self.blocks.enable_caching:
                self.cache_queries += seq.num_tokens
                self.cache_hits += computed if hits else 0
            if hits:
                self.blocks.take_prefix(seq, hits)
                seq.num_computed_tokens = computed
                cache_hits.append(seq)
            seq.num_cached_tokens = computed if hits else 0
            self.blocks.allocate(seq, computed + n)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append(ScheduledSeq(seq, n))
            budget -= n
        return SchedulerOutput(scheduled, preempted, cache_hits)

    def _preempt(self, seq: Sequence) -> None:
        self.blocks.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.blocks.free(seq)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
