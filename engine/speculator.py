"""DSpark speculation inside the engine step: draft for the decoding sequences in one batched call, choose each
sequence's verify length, then accept what the packed forward verified.

A sequence's draft context is a cache of its tapped hidden states (which the engine keeps in `Sequence.taps`): before
each draft call the context is brought up to the sequence's computed tokens, truncating after a rollback or
preemption and appending what is new. So rollback is just the engine's truncate, and a draft service that lost its
state (a restarted actor) is rebuilt from the taps with no special path.

With a `+lookup` mode, a sequence whose last tokens repeat earlier text drafts by prompt lookup instead (no draft
round; its p_d is one-hot on the copied token, which keeps sampling lossless), and only the others join the DSpark
round. Both kinds of block then compete in the same verify-length choice: a lookup block's confidences are its own
observed acceptance per position. In adaptive mode each kind has its own DraftGate, which scores the steps by what
that kind delivered, the other kind's tokens and time taken out.

A drafter that reads copy hints (`Drafter.copy_hint_ngram`) gets, with each block to propose, what prompt lookup
by its n-gram sizes proposes after the anchor. A hint depends only on the sequence's own tokens, so the drafter's
p_d is still a proposal fixed before verification, and verification stays lossless. So are a request's penalties,
which the drafter applies to its own logits (engine/penalties.py).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.acceptance import AcceptanceTracker
from engine.device_io import to_device
from engine.draft_gate import DraftGate
from engine.drafter import ContextSync, Drafter, DraftStep, DraftWork
from engine.load import StepLoad
from engine.ngram import NgramIndex
from engine.penalties import DraftPenalties
from engine.rejection_sampler import accept_greedy, verify_random
from engine.scheduler import ScheduledSeq, SchedulerOutput
from engine.sequence import Sequence
from engine.spec_mode import SpecMode, parse_speculation
from engine.step_cost import StepCostModel
from engine.verify_length import Candidate, choose_verify_lengths, latency_cap

log = logging.getLogger(__name__)
RETRY_AFTER_FAILURE_S = 5.0
CONTEXT_PAGE = 16  # tokens per page of the draft service's context pool (draft_service/context.py's default)
LOOKUP_MIN_N, LOOKUP_MAX_N = 2, 3  # a 1-gram match copies too often in vain (bench/drafter_report.py)
# A lookup draft's acceptance at each position given the ones before, before any is observed (the tracker scales it
# to what is seen): measured on the default model's held-out answers where a 2- or 3-gram matched (54% of anchors;
# runs there: tau 5.1). A copy that held so far tends to go on, so a flat prior would never try the late positions.
LOOKUP_PRIOR = [0.80, 0.87, 0.90, 0.92, 0.93, 0.94, 0.95]


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
    probs: torch.Tensor | None = None  # p_d of the block being verified (sampled requests; None for lookup)
    block: list[int] = field(default_factory=list)  # the drafted block
    by_lookup: bool = False  # whether the block came from prompt lookup rather than the drafter
    drafted_once: bool = False  # whether the drafter has drafted for it (DraftGate: fresh content)
    lookup: NgramIndex | None = None  # +lookup modes, and copy hints by the same n: the n-grams of the text so far
    hint_index: NgramIndex | None = None  # copy hints by other n than lookup's
    num_spec_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    histogram: list[int] = field(default_factory=list)  # accepted drafts per speculative step


@dataclass
class PendingVerify:
    """A step's acceptance, queued on the device: read `tensors` on the host (with the step's other results, at
    one synchronization), then `finish(values)` gives each drafted sequence's emitted tokens."""

    tensors: list[torch.Tensor]
    finish: Callable[[list[list]], list[list[int]]]


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
    skipped_lookups: int = 0  # steps where lookup blocks went unverified: verifying them had not paid at this load
    lookup_drafts: int = 0  # of `drafts`, those drafted by prompt lookup
    lookup_draft_tokens: int = 0
    lookup_accepted_tokens: int = 0
    hinted_drafts: int = 0  # (sequence, round) pairs sent to the drafter with a copy hint (Drafter.copy_hint_ngram)
    fallbacks: int = 0  # draft service failures that fell back to plain decoding
    context_limited: int = 0  # sequence-steps that decoded plainly because their draft context did not fit
    draft_seconds: float = 0.0


class Speculator:
    def __init__(self, service: Drafter, default_mode: SpecMode, cost: StepCostModel, budget: int,
                 context_capacity: int | None = None):
        """`context_capacity`: the tokens the draft service's context pool holds (pages of CONTEXT_PAGE), or None
        for no limit."""
        self.service = service
        self.context_pages = None if context_capacity is None else context_capacity // CONTEXT_PAGE
        self.context_holders: dict[str, int] = {}  # request id -> context tokens the service holds for it
        self.gamma = service.gamma
        # The n-gram sizes of the copy hints the drafter reads, or None (then none are computed). A drafter that
        # predates hints has no such property.
        hint_ngram = getattr(service, "copy_hint_ngram", None)
        self.hint_ngram = None if hint_ngram is None else (int(hint_ngram[0]), int(hint_ngram[1]))
        self.default_mode = default_mode
        self.cost = cost
        self.budget = budget
        self.tracker = AcceptanceTracker(self.gamma)
        self.lookup_tracker = AcceptanceTracker(self.gamma)  # against LOOKUP_PRIOR: lookup's observed acceptance
        self.gate = DraftGate()  # whether the DSpark round pays at this load
        self.lookup_gate = DraftGate()  # whether verifying lookup blocks pays at this load (adaptive+lookup)
        self.counters = SpecCounters(accepted_per_pos=[0] * self.gamma,
                                     verify_length_hist=[0] * (self.gamma + 1))
        self.draft_vocab = None
        self.disabled_until = 0.0
        self.last_verify_tokens = 0  # draft tokens verified in the last step (a load signal)
        self.scoring = None  # (decode seqs, predicted plain seconds, prefill seconds and first tokens) of a scored step
        self.drafted = False  # whether this step ran a draft round
        self.catch_up_s = 0.0  # of this step's round: appending context the sequences missed while not drafting
        self.gated = False  # whether the draft gate decided this step's round (adaptive mode)
        self.lookup_gated = False  # whether the lookup gate decided this step's lookup blocks
        self.plain_overhead_s = 0.0  # EMA of a plain step's time outside the forward (schedule, sample, emit)
        self.lookup_tokens = 0  # this step's lookup drafts verified ...
        self.lookup_accepted = 0  # ... and accepted
        self.lookup_seconds = 0.0  # ... and the forward time their rows are predicted to add
        self.drafter_accepted = 0  # this step's drafter drafts accepted, and the round's time plus the forward time
        self.drafter_seconds = 0.0  # their rows are predicted to add
        # Bumped on every draft-service failure: a failed (possibly restarted) service may have lost every context,
        # so each sequence rebuilds its context from scratch the next time it drafts.
        self.epoch = 0

    def mode_of(self, seq: Sequence) -> SpecMode:
        return parse_speculation(seq.params.speculation) if seq.params.speculation else self.default_mode

    # ----- before the forward -------------------------------------------------------------------------------

    def prepare(self, sched: SchedulerOutput, blocks, max_model_len: int, load: StepLoad) -> None:
        """Draft for the eligible decoding sequences and set each one's `draft_tokens`. `load` is this step's
        occupancy, queue and KV read (the same record the replica publishes); the verify tokens chosen here are
        added to it."""
        self.last_verify_tokens = self.lookup_tokens = self.lookup_accepted = self.drafter_accepted = 0
        self.scoring, self.drafted, self.gated, self.lookup_gated = None, False, False, False
        self.catch_up_s = self.lookup_seconds = self.drafter_seconds = 0.0
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
        forward = self.cost.forward
        decode_kv = sum(s.seq.num_computed_tokens for s in decoding)
        decode_seconds = forward.at(len(decoding), decode_kv)  # predicted, of the decode part
        prefill_seconds = forward.at(base_tokens, load.kv_tokens) - decode_seconds  # predicted, of the prefill chunks
        if decoding and prefill_seconds <= decode_seconds:
            # Scored once the step is done (observe_step): a plain step, whatever its requests' modes, calibrates the
            # gate's plain side; a gated draft round is scored against it. A step that also carries prefill chunks
            # (under continuous arrivals most steps do) is scored as its decode part, the chunks' predicted time and
            # first tokens taken out; not where they more than double the step, whose error would drown the round.
            self.scoring = (len(decoding), decode_seconds + self.plain_overhead_s, prefill_seconds,
                            load.decoding - len(decoding))
        if not eligible:
            return
        looked, rest = [], []  # (scheduled, room, lookup block)
        for s, room in eligible:
            block = self._lookup(s.seq) if self.mode_of(s.seq).lookup else []
            (looked if block else rest).append((s, room, block))
        if any(self.mode_of(s.seq).kind == "adaptive" for s, _, _ in looked):
            # Verifying copies is a bet like drafting, which loses under load: a gate of its own decides it
            self.lookup_gated = True
            if not self.lookup_gate.should_draft(len(decoding)):
                self.counters.skipped_lookups += 1
                rest += [x for x in looked if self.mode_of(x[0].seq).kind == "adaptive"]
                looked = [x for x in looked if self.mode_of(x[0].seq).kind != "adaptive"]
        drafting = rest if time.monotonic() >= self.disabled_until else []
        self.gated = any(self.mode_of(s.seq).kind == "adaptive" for s, _, _ in drafting)  # others draft as asked
        fresh = sum(not s.seq.spec.drafted_once for s, _, _ in drafting)
        if self.gated and not self.gate.should_draft(len(decoding), fresh):
            self.counters.skipped_rounds += 1
            drafting = []
        drafting = self._fit_contexts(drafting)
        step = self._draft([s.seq for s, _, _ in drafting]) if drafting else None
        if step is None:
            drafting = []
        else:
            self.draft_vocab = step.draft_vocab
            sampled_rows = {item: row for row, item in enumerate(step.sampled)}
            for j, (s, _, _) in enumerate(drafting):
                spec = s.seq.spec
                spec.block, spec.confidences, spec.by_lookup = step.tokens[j], step.confidences[j], False
                spec.drafted_once = True
                spec.probs = step.probs[sampled_rows[j]] if j in sampled_rows else None
        for s, _, block in looked:
            spec = s.seq.spec
            spec.block, spec.probs, spec.by_lookup = block, None, True
            prior = [LOOKUP_PRIOR[min(k, len(LOOKUP_PRIOR) - 1)] for k in range(len(block))]
            spec.confidences = self.lookup_tracker.corrected(s.seq.request_id, prior)
        chosen = looked + drafting
        if not chosen:
            return
        cands, corrected = [], {}
        for i, (s, room, _) in enumerate(chosen):
            seq = s.seq
            cap = min(room, latency_cap(seq.params.target_tpot_s, self.cost, base_tokens, len(drafting),
                                        self.gamma, load.kv_tokens))
            cands.append(Candidate(i, seq.spec.confidences, self.mode_of(seq), cap))
            # the drafter's confidences are corrected by the acceptance this sequence showed; lookup's already are
            corrected[i] = (seq.spec.confidences if seq.spec.by_lookup
                            else self.tracker.corrected(seq.request_id, seq.spec.confidences))
        lengths = choose_verify_lengths(cands, base_tokens, load.decoding, self.cost, self.budget, corrected,
                                        drafted=len(drafting), waiting=load.waiting, kv_tokens=load.kv_tokens)
        for i, (s, _, _) in enumerate(chosen):
            n = lengths[i]
            seq = s.seq
            if n and not blocks.allocate(seq, seq.num_computed_tokens + 1 + n):
                n = 0  # no KV room for the drafts: verify nothing rather than preempt someone
            s.draft_tokens = seq.spec.block[:n]
            if n == 0:  # nothing verified: the tracker still ages this sequence's evidence
                self._tracker(seq).record(seq.request_id, seq.spec.confidences, 0, 0)
            self.counters.verify_length_hist[n] += 1
            self.counters.proposed_tokens += len(seq.spec.block)
            self.last_verify_tokens += n
            self.lookup_tokens += n if seq.spec.by_lookup else 0
            load.drafted += n > 0
        load.verify_tokens = self.last_verify_tokens
        load.tokens += self.last_verify_tokens
        self.lookup_seconds = forward.at(load.tokens) - forward.at(load.tokens - self.lookup_tokens)
        self.drafter_seconds += forward.at(load.tokens) - forward.at(load.tokens - (self.last_verify_tokens
                                                                                     - self.lookup_tokens))

    def _lookup(self, seq: Sequence) -> list[int]:
        return self._ngram_index(seq, (LOOKUP_MIN_N, LOOKUP_MAX_N)).propose(seq.token_ids, self.gamma)[0]

    @staticmethod
    def _ngram_index(seq: Sequence, ngram: tuple[int, int]) -> NgramIndex:
        """The sequence's n-gram index for sizes `ngram`: lookup's, shared with copy hints of the same sizes."""
        spec = seq.spec
        if ngram == (LOOKUP_MIN_N, LOOKUP_MAX_N):
            if spec.lookup is None:
                spec.lookup = NgramIndex(*ngram)
            return spec.lookup
        if spec.hint_index is None:
            spec.hint_index = NgramIndex(*ngram)
        return spec.hint_index

    def _tracker(self, seq: Sequence) -> AcceptanceTracker:
        return self.lookup_tracker if seq.spec.by_lookup else self.tracker

    def _fit_contexts(self, drafting: list) -> list:
        """The sequences whose draft contexts, grown to their computed tokens, and blocks (pages lent for the round)
        fit the context pool; the others decode plainly this step. Sequences that already hold a context come first.
        Prefix caching makes this bind: sequences share the K/V blocks of a cached prefix, but each has its own draft
        context over it."""
        if self.context_pages is None or not drafting:
            return drafting

        def pages(n: int) -> int:
            return -(-n // CONTEXT_PAGE)

        held = {k: pages(v) for k, v in self.context_holders.items()}
        total, lent, allowed = sum(held.values()), 0, set()
        for first in (True, False):
            for s, _, _ in drafting:
                key, n = s.seq.request_id, s.seq.num_computed_tokens
                if (key in held) != first or key in allowed:
                    continue
                grow, block = pages(n) - held.get(key, 0), pages(n + self.gamma) - pages(n)
                if total + grow + lent + block <= self.context_pages:
                    allowed.add(key)
                    total, lent, held[key] = total + grow, lent + block, pages(n)
        if len(allowed) < len(drafting):
            self.counters.context_limited += len(drafting) - len(allowed)
        return [x for x in drafting if x[0].seq.request_id in allowed]

    def _draft(self, seqs: list[Sequence]) -> DraftStep | None:
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
            self.context_holders[seq.request_id] = computed
            hint = None
            if self.hint_ngram is not None:  # what lookup proposes after the anchor (the last of token_ids)
                hint = self._ngram_index(seq, self.hint_ngram).propose(seq.token_ids, self.gamma - 1)[0] or None
                self.counters.hinted_drafts += hint is not None
            penalties = DraftPenalties.of(seq.params, seq.prompt_token_ids, seq.output_token_ids)
            work.append(DraftWork(seq.request_id, seq.token_ids[-1], computed, seq.params.temperature,
                                  seq.params.seed, hint, penalties))
        t0 = time.perf_counter()
        try:
            step = self.service.step(syncs, work)
        except Exception as exc:  # a dead or failing draft service: decode plainly, rebuild contexts later
            self.counters.fallbacks += 1
            self.disabled_until = time.monotonic() + RETRY_AFTER_FAILURE_S
            self.epoch += 1
            self.context_holders.clear()
            log.warning("draft service failed (%s); plain decoding for %.0f s", exc, RETRY_AFTER_FAILURE_S)
            return None
        seconds = time.perf_counter() - t0
        self.drafted = True
        self.drafter_seconds = seconds
        self.catch_up_s = step.append_seconds * catch_up / appended if appended else 0.0
        self.cost.draft.observe(len(seqs), seconds - self.catch_up_s)  # the round as it runs in steady drafting
        self.counters.draft_rounds += 1
        self.counters.draft_seconds += seconds
        return step

    def observe_step(self, emitted: int, seconds: float, forward_seconds: float) -> None:
        """The step is done: `emitted` tokens in `seconds`, `forward_seconds` of them in the packed forward."""
        if not self.drafted and not self.lookup_tokens:
            self.plain_overhead_s += 0.1 * (seconds - forward_seconds - self.plain_overhead_s)
        if self.scoring is not None:
            decoding, plain_seconds, prefill_seconds, prefill_emitted = self.scoring
            seconds -= prefill_seconds
            emitted -= prefill_emitted
            # Each gate judges its own kind of draft: the step is scored as if the other kind had not been verified
            # (its accepted tokens and its time taken out: the rows' predicted forward cost, the round's measured).
            for gate, used, gated, other_accepted, other_seconds, catch_up in (
                    (self.gate, self.drafted, self.gated, self.lookup_accepted, self.lookup_seconds, self.catch_up_s),
                    (self.lookup_gate, self.lookup_tokens > 0, self.lookup_gated, self.drafter_accepted,
                     self.drafter_seconds, 0.0)):
                if not used:
                    gate.record_plain(decoding, seconds - other_seconds, plain_seconds)
                elif gated:
                    gate.record(decoding, emitted - other_accepted, seconds - other_seconds, plain_seconds, catch_up)
            self.scoring = None

    # ----- after the forward --------------------------------------------------------------------------------

    def verify(self, drafted: list[ScheduledSeq], logits: torch.Tensor, default_gen, argmax) -> PendingVerify:
        """logits: the verify rows of the drafted sequences, in order (1 + k rows each). Queues the acceptance of
        every sequence on the device; `finish` of the result, given the host values of its `tensors`, returns the
        tokens each sequence emits (accepted drafts, then one target token)."""
        greedy_idx = [i for i, s in enumerate(drafted) if s.seq.params.temperature == 0.0]
        random_idx = [i for i, s in enumerate(drafted) if s.seq.params.temperature > 0.0]
        offsets, row = [], 0
        for s in drafted:
            offsets.append(row)
            row += 1 + len(s.draft_tokens)
        tensors = []
        for idx, path in ((greedy_idx, "greedy"), (random_idx, "random")):
            if not idx:
                continue
            rows = [r for i in idx for r in range(offsets[i], offsets[i] + 1 + len(drafted[i].draft_tokens))]
            rows = to_device(torch.tensor(rows), logits.device)
            sub = logits.index_select(0, rows)
            if path == "greedy":
                tensors.append(argmax(sub) if argmax is not None else sub.argmax(-1))
            else:
                probs = [self._draft_probs(drafted[i], logits.shape[1], logits.device) for i in random_idx]
                tensors.extend(verify_random(sub, [drafted[i].draft_tokens for i in idx], probs,
                                             [drafted[i].seq.params for i in idx],
                                             [drafted[i].seq.generator for i in idx], default_gen))

        def finish(host: list[list]) -> list[list[int]]:
            out: list[list[int]] = [[] for _ in drafted]
            if greedy_idx:
                res = accept_greedy(host.pop(0), [drafted[i].draft_tokens for i in greedy_idx])
                for j, i in enumerate(greedy_idx):
                    out[i] = res.tokens[j]
                    self._record(drafted[i], res.num_accepted[j])
            if random_idx:
                num_accepted, emitted = host
                for j, i in enumerate(random_idx):
                    out[i] = drafted[i].draft_tokens[:num_accepted[j]] + [emitted[j]]
                    self._record(drafted[i], num_accepted[j])
            return out

        return PendingVerify(tensors, finish)

    def _draft_probs(self, s: ScheduledSeq, vocab_size: int, device: torch.device) -> torch.Tensor:
        """p_d of the verified drafts over the target vocabulary: one-hot for copied (lookup) drafts; the drafter's
        probabilities, 0 outside its draft vocabulary, otherwise."""
        k = len(s.draft_tokens)
        if s.seq.spec.by_lookup:
            ids = to_device(torch.tensor(s.draft_tokens), device)
            return torch.zeros(k, vocab_size, device=device).scatter_(1, ids[:, None], 1.0)
        compact = s.seq.spec.probs[:k]
        if self.draft_vocab is None:
            return compact
        vocab = self.draft_vocab.to(compact.device)
        return compact.new_zeros(k, vocab_size).index_copy_(1, vocab, compact)

    def _record(self, s: ScheduledSeq, accepted: int) -> None:
        spec, k = s.seq.spec, len(s.draft_tokens)
        self._tracker(s.seq).record(s.seq.request_id, spec.confidences, k, accepted)
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
        if spec.by_lookup:
            c.lookup_drafts += 1
            c.lookup_draft_tokens += k
            c.lookup_accepted_tokens += accepted
            self.lookup_accepted += accepted
        else:
            self.drafter_accepted += accepted

    def finish(self, seqs: list[Sequence]) -> None:
        keys = [s.request_id for s in seqs if s.spec is not None]
        for key in keys:
            self.tracker.forget(key)
            self.lookup_tracker.forget(key)
            self.context_holders.pop(key, None)
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
