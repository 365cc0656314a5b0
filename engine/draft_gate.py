"""The draft gate: whether a draft round pays at this load, judged by what draft rounds have delivered.

Adaptive mode's verify length (engine/verify_length.py) decides how many drafts to check once a round ran; the gate
decides whether to run the round at all, since at some loads the round costs more than its accepted tokens save.
Pure Python over plain numbers: no tensors, no model.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Evidence:
    """Sums over drafted steps (see DraftGate.record), fading or not."""

    gain: float = 0.0  # (tokens emitted) x (seconds a plain step would take, as predicted)
    cost: float = 0.0  # (sequences decoding) x (seconds the drafted step took, context catch-up excluded)
    full_cost: float = 0.0  # the same with the catch-up: what the steps really took
    tokens: float = 0.0  # tokens emitted
    sequences: float = 0.0  # sequences decoding

    def add(self, step: tuple[float, float, float, float, float], fade: float) -> None:
        self.gain, self.cost, self.full_cost, self.tokens, self.sequences = (
            fade * old + new for old, new in zip((self.gain, self.cost, self.full_cost, self.tokens, self.sequences),
                                                 step))

    def goodput(self) -> float:
        """The drafted steps' goodput over plain steps' (as predicted): the score before the plain bias."""
        return self.gain / self.cost


@dataclass
class _GateState:
    drafted: _Evidence = field(default_factory=_Evidence)  # fading sums over the drafted steps
    trial: _Evidence = field(default_factory=_Evidence)  # a trial's steps (DraftGate, fresh content)
    trial_left: int = 0  # drafted steps left in a running trial
    samples: int = 0
    evidence: int = 0  # sequence-steps scored
    since_switch: int = 0  # closed: steps skipped since the last probe; open: steps drafted since the last control
    closed: bool = False  # the score fell to 1 or below and has not since risen above 1 + reopen_margin
    plain_measured: float = 0.0  # EMA of plain steps' seconds ...
    plain_predicted: float = 0.0  # ... and of what the cost curve predicted for them
    plain_samples: int = 0


@dataclass
class DraftGate:
    """Whether adaptive mode pays for a draft round this step, judged by what draft rounds have delivered.

    Each drafted step is scored by its goodput over plain decoding's at the same load: (tokens emitted / seconds the
    step took) over (sequences decoding / seconds a plain step of that batch takes). No acceptance estimate is
    needed; those from verified positions alone are optimistic, since adaptive verifies only the positions it trusts.
    The plain side is the cost curve's prediction scaled by what this bucket's plain steps measured against it (a
    curve point fitted from other batch sizes can be off by more than the margin judged), so both sides are
    measured: a closed bucket's steps are plain, an open one runs a plain control step now and then. Scores are kept
    per load bucket (decoding sequences, powers of two) and fade per sequence-step (`seq_alpha`, at most `alpha` a
    step), since one sequence emits 1 to gamma + 1 tokens a step and a memory counted in steps alone is too short.

    A bucket drafts until its score falls to 1 or below, then drafts only to probe until the score rises above
    1 + `reopen_margin`: where drafting about ties, single steps scatter widely and a few lucky probes would reopen
    it. Probes (closed) and control steps (open) are spaced so that each loses at most `probe_overhead` of the time.
    A probe first catches every sequence's draft context up on the steps decoded plainly since the last round: a
    switching cost, so the deciding score leaves it out while the probe spacing counts it.

    At one or two sequences the batch is one or two answers, and what closed the bucket may be an answer that has
    since finished. So when fresh sequences (never drafted) are at least half of such a closed bucket's batch, it
    drafts `trial_steps` steps in a row, scored on their own: above 1 + `reopen_margin` they replace the bucket's
    evidence and it reopens; otherwise they count as probes."""

    alpha: float = 0.1  # the fastest fade a step (of many sequences): about the last 10 steps count
    seq_alpha: float = 1 / 64  # the fade per sequence of a step: at one sequence, about the last 64 steps count
    probe_overhead: float = 0.005  # the share of time probes may lose: a clear loss is probed rarely, a tie often
    probe_every: int = 8
    max_probe_every: int = 2048  # the longest spacing: a clear loss at high load is still probed now and then
    min_evidence: int = 64  # sequence-steps a bucket scores before it may close: one memory's worth (see seq_alpha)
    plain_alpha: float = 0.1  # per plain step scored
    min_plain_samples: int = 2  # plain steps measured in a bucket before control steps are spaced out
    reopen_margin: float = 0.04  # a closed bucket reopens at a score above 1 + this
    trial_steps: int = 4  # drafted steps of a trial of fresh content (below)
    trial_max_seqs: int = 2  # the loads at which trials run: where one answer's content decides

    def __post_init__(self) -> None:
        self.buckets: dict[int, _GateState] = {}

    def _state(self, num_decoding: int) -> _GateState:
        return self.buckets.setdefault(num_decoding.bit_length(), _GateState())

    def plain_bias(self, num_decoding: int) -> float:
        """Measured / predicted seconds of this bucket's plain steps (1 before any was measured)."""
        st = self._state(num_decoding)
        return st.plain_measured / st.plain_predicted if st.plain_samples else 1.0

    def score(self, num_decoding: int) -> float | None:
        st = self._state(num_decoding)
        return st.drafted.goodput() * self.plain_bias(num_decoding) if st.samples else None

    def _judge(self, num_decoding: int) -> int:
        """A load whose bucket decides for this one: itself, or, while its bucket has too little evidence of its own,
        the nearest lower bucket that has enough, if that one is closed. Drafting pays less as load grows (the draft
        round's share of a step grows with the batch), so a load above one where drafting lost starts closed rather
        than drafting to explore; it still probes. Exploring fresh would draft at a loss in the buckets that load
        merely passes through on its way up."""
        if self._state(num_decoding).evidence >= self.min_evidence:
            return num_decoding
        for bits in range(num_decoding.bit_length() - 1, 0, -1):
            lower = self.buckets.get(bits)
            if lower is not None and lower.evidence >= self.min_evidence:
                n = 1 << (bits - 1)  # a load in that bucket
                return n if not self._open_on_own(n) else num_decoding
        return num_decoding

    def _open_on_own(self, num_decoding: int) -> bool:
        st = self._state(num_decoding)
        return not st.closed or st.evidence < self.min_evidence

    def _update(self, num_decoding: int) -> None:
        """Close at a score of 1 or below; reopen above 1 + reopen_margin."""
        st, score = self._state(num_decoding), self.score(num_decoding)
        if score is not None:
            st.closed = score <= 1.0 + (self.reopen_margin if st.closed else 0.0)

    def is_open(self, num_decoding: int) -> bool:
        return self._open_on_own(self._judge(num_decoding))

    def _spacing(self, num_decoding: int) -> int:
        """Steps between probes (closed) or control steps (open), from the plain steps each loses: a probe
        (tokens per sequence) x (1/score - 1), since plain decoding would have taken that many steps for its tokens;
        a control step 1 - 1/score. Judged by the bucket that decides (`_judge`); where that is a lower bucket, this
        load's own probes, if any, may say a probe costs more here, and then the larger loss spaces them: a mild
        loss at a lower load would otherwise probe a heavier load far too often."""
        judge = self._judge(num_decoding)
        score = self.score(judge)
        if score is None:
            loss = 0.0
        elif score > 1.0:
            loss = 1.0 - 1.0 / score
        else:
            loss = self._probe_loss(judge)
            if judge != num_decoding and self._state(num_decoding).samples:
                loss = max(loss, self._probe_loss(num_decoding))
        return round(min(self.max_probe_every, max(self.probe_every, loss / self.probe_overhead)))

    def _probe_loss(self, num_decoding: int) -> float:
        """Plain steps a probe of this bucket loses, its context catch-up included: what probes really cost."""
        d = self._state(num_decoding).drafted
        return d.tokens / d.sequences * (d.full_cost / (d.gain * self.plain_bias(num_decoding)) - 1.0)

    def steps_until_probe(self, num_decoding: int) -> int:
        """Steps until this bucket next drafts (1 when open or in a trial)."""
        if self.is_open(num_decoding) or self._state(num_decoding).trial_left:
            return 1
        return max(1, self._spacing(num_decoding) - self._state(num_decoding).since_switch)

    def should_draft(self, num_decoding: int, fresh: int = 0) -> bool:
        """Whether to draft this step; `fresh`: how many of the `num_decoding` sequences have never drafted."""
        st = self._state(num_decoding)
        if st.trial_left:
            return True
        open_ = self.is_open(num_decoding)
        if not open_ and num_decoding <= self.trial_max_seqs and 2 * fresh >= num_decoding > 0:
            st.trial_left, st.trial = self.trial_steps, _Evidence()
            return True
        if open_:
            # Until a couple of plain steps are measured at this load, the prediction alone judges: check it soon.
            spacing = self._spacing(num_decoding) if st.plain_samples >= self.min_plain_samples else 2
            if st.samples and st.since_switch >= spacing:
                st.since_switch = 0
                return False  # a control step: measure plain decoding at this load
            st.since_switch += 1
            return True
        st.since_switch += 1
        if st.since_switch >= self._spacing(num_decoding):
            st.since_switch = 0
            return True  # a probe
        return False

    def skip(self, num_decoding: int, steps: int) -> None:
        """Count `steps` more skipped steps at once (the simulator's fast path; fewer than steps_until_probe)."""
        st = self._state(num_decoding)
        st.since_switch += steps

    def record(self, num_decoding: int, emitted: float, seconds: float, plain_seconds: float,
               catch_up_seconds: float = 0.0) -> None:
        """A drafted step: `emitted` tokens in `seconds`, where plain decoding of `num_decoding` tokens is predicted
        to take `plain_seconds`; `catch_up_seconds` of the step went to appending context the sequences had missed
        while the bucket decoded plainly."""
        st = self._state(num_decoding)
        st.samples += 1
        st.evidence += num_decoding
        fade = 1.0 - min(self.alpha, num_decoding * self.seq_alpha)
        step = (emitted * plain_seconds, num_decoding * (seconds - catch_up_seconds), num_decoding * seconds, emitted,
                num_decoding)
        st.drafted.add(step, fade)
        self._update(num_decoding)
        if st.trial_left:
            st.trial.add(step, 1.0)
            st.trial_left -= 1
            if not st.trial_left and st.trial.cost > 0.0 and (
                    st.trial.goodput() * self.plain_bias(num_decoding) > 1.0 + self.reopen_margin):
                st.drafted, st.closed = st.trial, False  # the fresh content wins: its evidence replaces the old
                st.evidence = max(st.evidence, self.min_evidence)
        if not self.is_open(num_decoding):
            st.since_switch = 0  # closed (again): the next probe is a full spacing away

    def record_plain(self, num_decoding: int, seconds: float, predicted_seconds: float) -> None:
        """A plain decode step of `num_decoding` sequences took `seconds`; the cost curve predicted
        `predicted_seconds`."""
        st = self._state(num_decoding)
        st.plain_samples += 1
        a = max(1.0 / st.plain_samples, self.plain_alpha)
        st.plain_measured += a * (seconds - st.plain_measured)
        st.plain_predicted += a * (predicted_seconds - st.plain_predicted)
        self._update(num_decoding)

