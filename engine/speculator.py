"""DSpark speculation inside the engine step: draft for the decoding sequences in one batched call, choose each
sequence's verify length, then accept what the packed forward verified.

A sequence's draft context is a cache of its tapped hidden states (which the engine keeps in `Sequence.taps`): before
each draft call the context is brought up to the sequence's computed tokens, truncating after a rollback or
preemption and appending what is new. So rollback is just the engine's truncate, and a draft service that lost its
state (a restarted actor) is rebuilt from the taps with no special path.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from draft_service.service import ContextSync, DraftWork
from engine.load import StepLoad
from engine.rejection_sampler import verify_greedy, verify_random
from engine.scheduler import ScheduledSeq, SchedulerOutput
from engine.sequence import Sequence
from engine.spec_controller import (AcceptanceTracker, Candidate, DraftGate, StepCostModel,
                                    choose_verify_lengths, latency_cap)
from engine.spec_mode import SpecMode, parse_speculation

log = logging.getLogger(__name__)
RETRY_AFTER_FAILURE_S = 5.0


def reproducible_only_plainly(params) -> bool:
    """A seeded sampled request must give the same text every time. Speculative sampling draws the same distribution
    but a different realization for each sequence of verify lengths, and the engine's own mode picks those from load
    and measured costs; so such a request decodes plainly unless it asked for a speculation mode itself."""
    return params.seed is not None and params.temperature > 0 and not params.speculation


@dataclass
class SeqSpec:
    """Per-sequence speculation state and metrics."""

    context_len: int = 0  # positions the draft service holds for this sequence
    epoch: int = 0  # the service epoch context_len refers to (see Speculator.epoch)
    confidences: list[float] = field(default_factory=list)  # of the block being verified
    probs: torch.Tensor | None = None  # p_d of the block being verified (sampled requests)
    num_spec_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    histogram: list[int] = field(default_factory=list)  # accepted drafts per speculative step


@dataclass
class SpecCounters:
    """Monotonic counters (rates are derived by readers)."""

    draft_rounds: int = 0  # draft service calls that proposed
    drafts: int = 0  # (sequence, step) pairs that verified at least one draft
    draft_tokens: int = 0  # draft tokens verified
    proposed_tokens: int = 0  # draft tokens proposed (gamma per sequence per round)
    accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    verify_length_hist: list[int] = field(default_factory=list)  # verify length 0..gamma of every drafted sequence
    skipped_rounds: int = 0  # steps where drafting could not pay off at this load
    fallbacks: int = 0  # draft service failures that fell back to plain decoding
    draft_seconds: float = 0.0


class Speculator:
    def __init__(self, service, default_mode: SpecMode, cost: StepCostModel, budget: int):
        self.service = service
        self.gamma = service.gamma
        self.default_mode = default_mode
        self.cost = cost
        self.budget = budget
        self.tracker = AcceptanceTracker(self.gamma)
        self.gate = DraftGate()
        self.counters = SpecCounters(accepted_per_pos=[0] * self.gamma,
                                     verify_length_hist=[0] * (self.gamma + 1))
        self.draft_vocab = None
        self.disabled_until = 0.0
        self.last_verify_tokens = 0  # draft tokens verified in the last step (a load signal)
        self.scoring = None  # (decoding sequences, predicted plain step seconds) of a gated pure decode step
        self.drafted = False  # whether this step ran a draft round
        self.catch_up_s = 0.0  # of this step's round: appending context the sequences missed while not drafting
        self.gated = False  # whether the draft gate decided this step's round (adaptive mode)
        self.plain_overhead_s = 0.0  # EMA of a plain step's time outside the forward (schedule, sample, emit)
        # Bumped on every draft-service failure: a failed (possibly restarted) service may have lost every context,
        # so each sequence rebuilds its context from scratch the next time it drafts.
        self.epoch = 0

    def mode_of(self, seq: Sequence) -> SpecMode:
        return parse_speculation(seq.params.speculation) if seq.params.speculation else self.default_mode

    # ----- before the forward -------------------------------------------------------------------------------

    def prepare(self, sched: SchedulerOutput, blocks, max_model_len: int, load: StepLoad) -> None:
        """Draft for the eligible decoding sequences and set each one's `draft_tokens`. `load` is this step's
        occupancy (the same record the replica publishes); the verify tokens chosen here are added to it."""
        self.last_verify_tokens = 0
        self.scoring, self.drafted, self.gated, self.catch_up_s = None, False, False, 0.0
        decoding = [s for s in sched.scheduled if s.samples and s.num_new_tokens == 1 and s.seq.num_output_tokens]
        base_tokens = load.base_tokens
        eligible = []
        for s in decoding:
            seq = s.seq
            if seq.spec is None:
                seq.spec = SeqSpec(histogram=[0] * (self.gamma + 1))
            room = min(seq.params.max_tokens - seq.num_output_tokens, max_model_len - seq.num_tokens) - 1
            if self.mode_of(seq).kind != "off" and room > 0 and not reproducible_only_plainly(seq.params):
                eligible.append((s, room))
        load.eligible = len(eligible)
        if decoding and base_tokens == load.decoding:
            # Scored once the step is done (observe_step): a plain step, whatever its requests' modes, calibrates the
            # gate's plain side; a gated draft round is scored against it. Pure decode steps only: a prefill chunk's
            # cost would drown the draft round's.
            self.scoring = (load.decoding, self.cost.forward.at(base_tokens) + self.plain_overhead_s)
        if not eligible or time.monotonic() < self.disabled_until:
            return
        gated = self.gated = any(self.mode_of(s.seq).kind == "adaptive" for s, _ in eligible)  # others draft as asked
        if gated and not self.gate.should_draft(load.decoding):
            self.counters.skipped_rounds += 1
            return
        step = self._draft([s.seq for s, _ in eligible])
        if step is None:
            return
        cands = []
        for i, (s, room) in enumerate(eligible):
            seq = s.seq
            seq.spec.confidences = step.confidences[i]
            cap = min(room, latency_cap(seq.params.target_tpot_s, self.cost, base_tokens, len(eligible),
                                        self.gamma))
            cands.append(Candidate(i, step.confidences[i], self.mode_of(seq), cap))
        corrected = {c.key: self.tracker.corrected(eligible[c.key][0].seq.request_id, c.confidences)
                     for c in cands}
        lengths = choose_verify_lengths(cands, base_tokens, load.decoding, self.cost, self.budget, corrected)
        sampled_rows = {item: row for row, item in enumerate(step.sampled)}
        for i, (s, _) in enumerate(eligible):
            n = lengths[i]
            seq = s.seq
            if n and not blocks.allocate(seq, seq.num_computed_tokens + 1 + n):
                n = 0  # no KV room for the drafts: verify nothing rather than preempt someone
            s.draft_tokens = step.tokens[i][:n]
            seq.spec.probs = step.probs[sampled_rows[i]] if i in sampled_rows else None
            if n == 0:  # nothing verified: the tracker still ages this sequence's evidence
                self.tracker.record(seq.request_id, seq.spec.confidences, 0, 0)
            self.counters.verify_length_hist[n] += 1
            self.counters.proposed_tokens += self.gamma
            self.last_verify_tokens += n
            load.drafted += n > 0
        load.verify_tokens = self.last_verify_tokens
        load.tokens += self.last_verify_tokens
        self.draft_vocab = step.draft_vocab

    def _draft(self, seqs: list[Sequence]):
        syncs, work = [], []
        appended = catch_up = 0  # context tokens appended; of them, more than one step can add to a sequence
        for seq in seqs:
            if seq.spec.epoch != self.epoch:
                seq.spec.context_len, seq.spec.epoch = 0, self.epoch
            computed = seq.num_computed_tokens  # the anchor (last token) sits at this position
            keep = min(seq.spec.context_len, computed)
            syncs.append(ContextSync(seq.request_id, keep, seq.taps.view()[keep:computed]))
            appended += computed - keep
            catch_up += max(0, computed - keep - (self.gamma + 1))
            seq.spec.context_len = computed
            work.append(DraftWork(seq.request_id, seq.token_ids[-1], computed, seq.params.temperature,
                                  seq.params.seed))
        t0 = time.perf_counter()
        try:
            step = self.service.step(syncs, work)
        except Exception as exc:  # a dead or failing draft service: decode plainly, rebuild contexts later
            self.counters.fallbacks += 1
            self.disabled_until = time.monotonic() + RETRY_AFTER_FAILURE_S
            self.epoch += 1
            log.warning("draft service failed (%s); plain decoding for %.0f s", exc, RETRY_AFTER_FAILURE_S)
            return None
        seconds = time.perf_counter() - t0
        self.drafted = True
        self.catch_up_s = step.append_seconds * catch_up / appended if appended else 0.0
        self.cost.draft.observe(len(seqs), seconds - self.catch_up_s)  # the round as it runs in steady drafting
        self.counters.draft_rounds += 1
        self.counters.draft_seconds += seconds
        return step

    def observe_step(self, emitted: int, seconds: float, forward_seconds: float) -> None:
        """The step is done: `emitted` tokens in `seconds`, `forward_seconds` of them in the packed forward."""
        if not self.drafted:
            self.plain_overhead_s += 0.1 * (seconds - forward_seconds - self.plain_overhead_s)
        if self.scoring is not None:
            decoding, plain_seconds = self.scoring
            if not self.drafted:
                self.gate.record_plain(decoding, seconds, plain_seconds)
            elif self.gated:
                self.gate.record(decoding, emitted, seconds, plain_seconds, self.catch_up_s)
            self.scoring = None

    # ----- after the forward --------------------------------------------------------------------------------

    def verify(self, drafted: list[ScheduledSeq], logits: torch.Tensor, default_gen, argmax) -> list[list[int]]:
        """logits: the verify rows of the drafted sequences, in order (1 + k rows each). Returns the tokens each
        sequence emits (accepted drafts, then one target token)."""
        greedy_idx = [i for i, s in enumerate(drafted) if s.seq.params.temperature == 0.0]
        random_idx = [i for i, s in enumerate(drafted) if s.seq.params.temperature > 0.0]
        offsets, row = [], 0
        for s in drafted:
            offsets.append(row)
            row += 1 + len(s.draft_tokens)
        out: list[list[int]] = [[] for _ in drafted]
        for idx, path in ((greedy_idx, "greedy"), (random_idx, "random")):
            if not idx:
                continue
            rows = torch.cat([torch.arange(offsets[i], offsets[i] + 1 + len(drafted[i].draft_tokens))
                              for i in idx]).to(logits.device)
            sub = logits.index_select(0, rows)
            drafts = [drafted[i].draft_tokens for i in idx]
            if path == "greedy":
                res = verify_greedy(sub, drafts, argmax)
            else:
                probs = [self._full_probs(drafted[i].seq.spec.probs[: len(drafted[i].draft_tokens)])
                         for i in idx]
                res = verify_random(sub, drafts, probs, [drafted[i].seq.params for i in idx],
                                    [drafted[i].seq.generator for i in idx], default_gen)
            for j, i in enumerate(idx):
                out[i] = res.tokens[j]
                self._record(drafted[i], res.num_accepted[j])
        return out

    def _full_probs(self, compact: torch.Tensor) -> torch.Tensor:
        """p_d over the draft vocabulary -> over the target vocabulary (0 outside the draft vocabulary)."""
        if self.draft_vocab is None:
            return compact
        vocab = self.draft_vocab.to(compact.device)
        return compact.new_zeros(compact.shape[0], self.service.vocab_size).index_copy_(1, vocab, compact)

    def _record(self, s: ScheduledSeq, accepted: int) -> None:
        spec, k = s.seq.spec, len(s.draft_tokens)
        self.tracker.record(s.seq.request_id, spec.confidences, k, accepted)
        spec.num_spec_steps += 1
        spec.num_draft_tokens += k
        spec.num_accepted_tokens += accepted
        spec.histogram[accepted] += 1
        c = self.counters
        c.drafts += 1
        c.draft_tokens += k
        c.accepted_tokens += accepted
        for p in range(accepted):
            c.accepted_per_pos[p] += 1

    def finish(self, seqs: list[Sequence]) -> None:
        keys = [s.request_id for s in seqs if s.spec is not None]
        for key in keys:
            self.tracker.forget(key)
        if keys:
            try:
                self.service.release(keys)
            except Exception as exc:
                log.warning("draft service release failed: %s", exc)

    @staticmethod
    def request_metrics(seq: Sequence) -> dict:
        spec = seq.spec
        if spec is None or not spec.num_spec_steps:
            return {"num_spec_steps": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                    "mean_acceptance_length": 1.0, "acceptance_histogram": []}
        return {
            "num_spec_steps": spec.num_spec_steps,
            "num_draft_tokens": spec.num_draft_tokens,
            "num_accepted_tokens": spec.num_accepted_tokens,
            # tokens emitted per speculative step: the accepted drafts plus the target's own token
            "mean_acceptance_length": 1.0 + spec.num_accepted_tokens / spec.num_spec_steps,
            "acceptance_histogram": list(spec.histogram),
        }
