"""How many draft tokens each sequence verifies this step. Pure Python over plain numbers: no tensors, no model.

Adaptive mode is Algorithm 1 of the DSpark paper (the hardware-aware prefix scheduler): rank every (sequence,
position) pair by its prefix survival a_{r,j} = prod_{i<=j} c_{r,i}, admit pairs in that order while the expected
throughput tau * SPS(B) still grows, and stop at the first pair that does not raise it. The early stop keeps the
rule lossless under sampling: whether position j is verified depends on c_1..c_j, which depend on the drafts before
j but never on draft j itself (a search that looks further ahead leaks x_j into its own admission; see
tests/test_spec_controller.py for the paper's Appendix-A example).

Beyond the paper: the confidences are corrected online by the acceptance each sequence actually showed per position
(`AcceptanceTracker`), so a confidence head that is over-confident on hard content still gets short verifies; a
gate skips draft rounds at loads where measured drafting has not paid (`DraftGate`); and an optional per-request
latency target caps a request's verify length.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from engine.spec_mode import SpecMode


@dataclass
class Candidate:
    """One decoding sequence that may verify drafts this step."""

    key: object
    confidences: list[float]  # calibrated c_1..c_gamma
    mode: SpecMode
    cap: int  # most drafts it may verify (tokens left, latency target)


def isotonic(values: list[float]) -> list[float]:
    """The least-squares non-decreasing fit of `values` (pool adjacent violators)."""
    pools: list[list[float]] = []  # [sum, count] of each run of pooled values
    for v in values:
        pools.append([v, 1])
        while len(pools) > 1 and pools[-2][0] * pools[-1][1] > pools[-1][0] * pools[-2][1]:
            total, n = pools.pop()
            pools[-1][0] += total
            pools[-1][1] += n
    return [total / n for total, n in pools for _ in range(int(n))]


@dataclass
class Curve:
    """Seconds as a function of a size: a shape on a grid (piecewise linear, extrapolated linearly beyond it) times
    a speed factor, both kept current by measurements.

    The factor follows the machine: every measurement moves it by `alpha` of its relative error, so a machine that
    slows down (this shared CPU swings 2x within minutes) scales every point at once. The remaining error corrects
    the two nearest grid points, shared by their interpolation weights (so a step of 100 tokens does not drag the
    point at 64 towards its own, longer, time). Without the factor, the points seen often (1 token at concurrency 1)
    track the machine while the rest keep the speed of whenever they were last seen, and the curve's slope, which is
    what Algorithm 1 weighs, becomes a record of the machine's mood. Reads go through the least-squares
    non-decreasing fit of the points: more work never takes less time, and a noisy point below its left neighbour
    would make the next token look free."""

    grid: list[int]
    seconds: list[float]
    alpha: float = 0.1
    scale: float = 1.0

    def __post_init__(self) -> None:
        self.fitted = isotonic(self.seconds)

    @staticmethod
    def _interpolate(g: list[int], s: list[float], x: float) -> float:
        if x <= g[0]:
            return s[0]
        if x >= g[-1]:
            return s[-1] * x / g[-1]
        i = bisect.bisect_right(g, x) - 1
        w = (x - g[i]) / (g[i + 1] - g[i])
        return s[i] + w * (s[i + 1] - s[i])

    def at(self, x: float) -> float:
        return self.scale * self._interpolate(self.grid, self.fitted, x)

    def observe(self, x: float, seconds: float) -> None:
        g = self.grid
        shape = self._interpolate(g, self.seconds, x)  # the raw points, which converge to the data
        if shape > 0:
            self.scale *= 1.0 + self.alpha * (seconds / (self.scale * shape) - 1.0)
        error = (seconds / self.scale - shape) / 4  # the shape moves slower: most of a change is the machine's
        if x <= g[0]:
            points = [(0, 1.0)]
        elif x >= g[-1]:
            points, error = [(len(g) - 1, 1.0)], error * g[-1] / x
        else:
            i = bisect.bisect_right(g, x) - 1
            w = (x - g[i]) / (g[i + 1] - g[i])
            points = [(i, 1.0 - w), (i + 1, w)]
        for i, weight in points:
            self.seconds[i] += self.alpha * weight * error
        self.fitted = isotonic(self.seconds)


@dataclass
class StepCostModel:
    """The cost of one engine step: the packed forward as a function of its tokens B, plus the draft round as a
    function of the sequences drafted (independent of how many drafts are then verified). SPS(B) is its inverse.
    Both curves are seeded by a start-up sweep and follow the measured steps from then on."""

    forward: Curve
    draft: Curve | None = None

    def step_seconds(self, tokens: int, drafted_seqs: int = 0) -> float:
        extra = self.draft.at(drafted_seqs) if (drafted_seqs and self.draft is not None) else 0.0
        return self.forward.at(tokens) + extra

    def sps(self, tokens: int, drafted_seqs: int = 0) -> float:
        return 1.0 / self.step_seconds(tokens, drafted_seqs)

    def table(self) -> dict[int, float]:
        """SPS(B) at the grid points, for metrics."""
        return {b: 1.0 / self.forward.at(b) for b in self.forward.grid}


@dataclass
class AcceptanceTracker:
    """Observed acceptance per block position, per sequence and overall, against what the confidences predicted.

    For position k the correction is ratio_k = observed_k / predicted_k, both EMAs over the steps in which position
    k was reached (its prefix accepted and k verified). A sequence's own ratio starts at the global one and moves to
    its own as its observations outweigh `prior_weight`."""

    gamma: int
    decay: float = 0.9  # per sequence: about its last 10 steps
    global_decay: float = 0.99  # over all sequences: about the last 100 observations
    prior_weight: float = 4.0

    def __post_init__(self) -> None:
        self.global_obs = [0.0] * self.gamma
        self.global_pred = [0.0] * self.gamma
        self.per_seq: dict = {}  # key -> (observed, predicted) EMAs per position

    def record(self, key, confidences: list[float], verified: int, accepted: int) -> None:
        """A draft step of `key` verified `verified` drafts of which the first `accepted` were accepted. Called for
        every drafted step, also when nothing was verified: a sequence's evidence fades step by step, so a position
        it stopped verifying drifts back to the global estimate and gets tried again."""
        obs, pred = self.per_seq.setdefault(key, ([0.0] * self.gamma, [0.0] * self.gamma))
        reached = min(verified, accepted + 1)  # the accepted positions and the first rejection
        d = self.global_decay
        for k in range(self.gamma):
            obs[k] *= self.decay
            pred[k] *= self.decay
            if k < reached:
                hit = 1.0 if k < accepted else 0.0
                obs[k] += hit
                pred[k] += confidences[k]
                self.global_obs[k] = d * self.global_obs[k] + hit
                self.global_pred[k] = d * self.global_pred[k] + confidences[k]

    def ratio(self, key, k: int) -> float:
        g = (self.global_obs[k] + 1.0) / (self.global_pred[k] + 1.0)  # +1 on both: a neutral prior
        obs, pred = self.per_seq.get(key, (None, None))
        if obs is None:
            return g
        return (obs[k] + self.prior_weight * g) / (pred[k] + self.prior_weight)

    def corrected(self, key, confidences: list[float]) -> list[float]:
        return [min(1.0, max(0.0, c * self.ratio(key, k))) for k, c in enumerate(confidences)]

    def forget(self, key) -> None:
        self.per_seq.pop(key, None)


def survival(confidences: list[float]) -> list[float]:
    out, a = [], 1.0
    for c in confidences:
        a *= c
        out.append(a)
    return out


def choose_verify_lengths(cands: list[Candidate], base_tokens: int, num_decoding: int, cost: StepCostModel,
                          budget: int, corrected: dict | None = None, drafted: int | None = None) -> dict:
    """Verify length per candidate key. `base_tokens`: tokens this step runs without drafts (prefill chunks and one
    per decoding sequence); `num_decoding`: sequences that emit a token this step; `budget`: the token budget;
    `corrected`: key -> confidences after the online correction, used by adaptive candidates; `drafted`: sequences
    the draft round ran for (default: every candidate; blocks copied by prompt lookup need no round)."""
    lengths: dict = {}
    tokens, tau = base_tokens, float(num_decoding)
    adaptive: list[tuple[float, int, object]] = []
    for c in cands:
        # Only the adaptive policy uses the online correction; threshold:C means the calibrated confidences.
        conf = corrected.get(c.key, c.confidences) if corrected and c.mode.kind == "adaptive" else c.confidences
        cap = max(0, min(c.cap, len(conf)))
        if c.mode.kind == "fixed":
            n = min(c.mode.k, cap)
        elif c.mode.kind == "threshold":
            n = 0
            while n < cap and conf[n] >= c.mode.threshold:
                n += 1
        elif c.mode.kind == "adaptive":
            for j, a in enumerate(survival(conf[:cap])):
                adaptive.append((a, j + 1, c.key))
            n = 0
        else:
            n = 0
        n = min(n, max(0, budget - tokens))
        lengths[c.key] = n
        tokens += n
        tau += sum(survival(conf[:n]))
    # Algorithm 1: by survival, highest first (ties: earlier position first, so prefixes stay prefixes).
    adaptive.sort(key=lambda t: (-t[0], t[1]))
    drafted = len(cands) if drafted is None else drafted
    best = tau * cost.sps(tokens, drafted)
    for a, j, key in adaptive:
        if a <= 0.0 or tokens + 1 > budget or lengths[key] != j - 1:
            break
        theta = (tau + a) * cost.sps(tokens + 1, drafted)
        if theta <= best:
            break  # early stop: the first pair that does not raise throughput ends the admission
        best, tau, tokens = theta, tau + a, tokens + 1
        lengths[key] = j
    return lengths


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

    Every drafted step is scored by its goodput against plain decoding at the same load: (tokens emitted / seconds
    the step took) over (sequences decoding / seconds a plain step of the same batch takes). The score needs no
    acceptance estimate; estimates from verified positions alone are optimistic, because adaptive verifies only the
    positions it trusts. The plain side is the cost curve's prediction, scaled by what plain steps of the same bucket
    measured against their predictions: a curve point fitted from other batch sizes can sit off by more than the
    margin being judged. So both sides are measured: a closed bucket's steps are plain, and an open bucket runs a
    plain control step now and then. Scores are kept per load bucket (decoding sequences, powers of two).

    A score is a ratio of sums over the drafted steps that fade with every drafted step, the faster the more
    sequences it carried (`seq_alpha` a sequence, at most `alpha` a step), so it rests on about the last 64 sequence-
    steps: the tokens one sequence emits in a step vary from 1 to gamma + 1. With a memory of 20 steps whatever their
    size, a 12% win at one sequence kept swinging across 1 (the gate shut 37-68% of the steps), and with old evidence
    fading during the pause before a probe, one lucky probe of 4 sequences reopened a bucket that was losing 15%. Both
    sides of the ratio are measured at the same moment, so old evidence does not go stale with the machine's speed. A
    bucket drafts until its score falls to 1 or below; then it drafts only to probe, until the score rises above
    1 + `reopen_margin`. Probes (closed) and control steps (open) are spaced so that each loses at most
    `probe_overhead` of the time. The margin is for loads where drafting about ties: at 4 sequences single steps
    scored 0.48 to 1.6 around a mean near 1, and without it the bucket reopened on a few lucky probes and drafted at
    0.83-0.91x `off` for whole cells.

    A probe first brings every sequence's draft context up to date: the taps of all the steps decoded plainly since
    the last round. That catch-up is a switching cost, not what drafting costs while the bucket is open, so the score
    that decides leaves it out; the spacing of probes counts it, since a probe really pays it (at 64 sequences, after
    about 150 plain steps: a probe took 212 ms against a 48 ms plain step, 0.31x with the catch-up).

    At one or two sequences the batch is one or two answers, and what closed a bucket may have been an answer that
    drafted poorly and has since finished (at one sequence in-domain, 2 of 8 cells of 4 answers closed this way, and
    the answers after it inherited the closed bucket: probes 8+ steps apart, one sequence-step each, take about 20
    probes to outweigh a memory of 64 sequence-steps). So when fresh sequences (never drafted yet) make up at least half
    of such a closed bucket's batch, it drafts `trial_steps` steps in a row, scored on their own: above
    1 + `reopen_margin` they replace the bucket's evidence, whose content has left, and it reopens; otherwise they
    count as probes. Content that drafts poorly everywhere (hard prompts) costs a trial per answer."""

    alpha: float = 0.1  # the fastest fade a step (of many sequences): about the last 10 steps count
    seq_alpha: float = 1 / 64  # the fade per sequence of a step: at one sequence, about the last 64 steps count
    probe_overhead: float = 0.005  # the share of time probes may lose: a clear loss is probed rarely, a tie often
    probe_every: int = 8
    max_probe_every: int = 2048  # a clear loss at 64 sequences is probed once in 600 steps; at 50 ms, 30 s
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
        round's share of a step grows with the batch: 0.26 of a plain step at one sequence, 0.66 at 64 here), so a
        load above one where drafting lost starts closed rather than drafting to explore; it still probes. (Explored
        fresh, buckets that load merely passed through, 13 to 15 sequences on the way to 16, drafted at 0.47-0.80x
        a plain step's goodput.)"""
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
        load's own probes, if any, may say a probe costs more here: at 4 sequences on hard content, probes spaced by
        the one-sequence bucket's mild loss (every 29 steps) cost 1.5 plain steps each, 5% of the time."""
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


def latency_cap(target_tpot_s: float | None, cost: StepCostModel, tokens: int, drafted_seqs: int,
                gamma: int) -> int:
    """Most drafts a request may add to a step of `tokens` tokens so that the step, and so the wait for its next
    token, stays within its latency target (0 when even a plain step is slower)."""
    if target_tpot_s is None:
        return gamma
    n = gamma
    while n > 0 and cost.step_seconds(tokens + n, drafted_seqs) > target_tpot_s:
        n -= 1
    return n
