"""The verify-length controller as a pure function of plain numbers."""
from __future__ import annotations

import itertools
import random

import pytest

from engine.spec_controller import (AcceptanceTracker, Candidate, Curve, DraftGate, StepCostModel, isotonic,
                                    choose_verify_lengths, latency_cap, survival)
from engine.spec_mode import SpecMode, parse_speculation

ADAPTIVE = SpecMode("adaptive")


def affine_cost(t0=0.02, t1=0.0004, draft=0.004, max_b=512) -> StepCostModel:
    grid = [1, 2, 4, 8, 16, 32, 64, 128, 256, max_b]
    return StepCostModel(Curve(grid, [t0 + t1 * b for b in grid]), Curve([1, 64], [draft, draft]))


def throughput(lengths, cands, base, n_dec, cost):
    tokens = base + sum(lengths.values())
    tau = n_dec + sum(sum(survival(c.confidences[: lengths[c.key]])) for c in cands)
    return tau * cost.sps(tokens, len(cands))


def test_algorithm1_matches_brute_force_on_small_cases():
    rng = random.Random(0)
    for trial in range(300):
        gamma = rng.randint(1, 4)
        n = rng.randint(1, 3)
        cands = [Candidate(i, [rng.uniform(0.05, 1.0) for _ in range(gamma)], ADAPTIVE, gamma) for i in range(n)]
        base = n + rng.randint(0, 40)
        cost = affine_cost(t0=rng.uniform(0.005, 0.05), t1=rng.uniform(1e-5, 5e-3), draft=rng.uniform(0, 0.01))
        got = choose_verify_lengths(cands, base, n, cost, budget=10**6)
        best = max(throughput(dict(zip(range(n), ls)), cands, base, n, cost)
                   for ls in itertools.product(range(gamma + 1), repeat=n))
        assert throughput(got, cands, base, n, cost) == pytest.approx(best, rel=1e-9), trial


def first_token_distribution(p_t, p_d, verify_len_for):
    """Exact distribution of the first emitted token under the rejection rule, when the verify length chosen
    for the block may depend on the first draft x1 (verify_len_for(x1))."""
    V = len(p_t)
    residual = [max(p_t[y] - p_d[y], 0.0) for y in range(V)]
    z = sum(residual)
    residual = [r / z for r in residual] if z else residual
    out = [0.0] * V
    for x1 in range(V):
        if verify_len_for(x1) == 0:
            for y in range(V):
                out[y] += p_d[x1] * p_t[y]
        else:
            acc = min(1.0, p_t[x1] / p_d[x1])
            out[x1] += p_d[x1] * acc
            for y in range(V):
                out[y] += p_d[x1] * (1 - acc) * residual[y]
    return out


def test_appendix_a_example_stays_lossless():
    """p_t = (.7, .3), p_d = (.5, .5); c_2 depends on the first draft. A search that looks past the first position
    verifies x1 only when x1 = 0, which skews the output to (.85, .15); Algorithm 1's early stop does not."""
    p_t, p_d = [0.7, 0.3], [0.5, 0.5]
    conf = {0: [0.5, 0.99], 1: [0.5, 0.01]}  # c_2 high only after drafting token 0
    cost = StepCostModel(Curve([1, 2, 3], [1.0, 1.6, 1.6]))  # flat from 2 to 3 tokens (e.g. a padded bucket)

    def ours(x1):
        return choose_verify_lengths([Candidate("r", conf[x1], ADAPTIVE, 2)], 1, 1, cost, budget=8)["r"]

    def global_search(x1):
        return max(range(3), key=lambda l: (1 + sum(survival(conf[x1][:l]))) * cost.sps(1 + l))

    assert [global_search(0), global_search(1)] == [2, 0]  # the leak exists in this setting
    assert first_token_distribution(p_t, p_d, global_search) == pytest.approx([0.85, 0.15])
    assert first_token_distribution(p_t, p_d, ours) == pytest.approx(p_t)


def test_verify_length_shrinks_as_load_grows():
    """More decoding sequences in the batch: no sequence verifies more, and the mean verify length falls. A step
    whose token budget is mostly taken by prefill chunks leaves fewer tokens to verify."""
    rng = random.Random(1)
    cost = affine_cost()
    confs = [[rng.uniform(0.6, 0.95) for _ in range(7)] for _ in range(64)]
    previous, means = None, []
    for n in (1, 2, 4, 8, 16, 32, 64):
        cands = [Candidate(i, confs[i], ADAPTIVE, 7) for i in range(n)]
        lengths = choose_verify_lengths(cands, n, n, cost, budget=4096)
        if previous:
            assert all(lengths[k] <= previous[k] for k in previous)
        previous = lengths
        means.append(sum(lengths.values()) / n)
    assert means[0] > means[-1]
    cands = [Candidate(i, confs[i], ADAPTIVE, 7) for i in range(8)]
    spare = [sum(choose_verify_lengths(cands, 8 + prefill, 8, cost, budget=256).values())
             for prefill in (200, 240, 248)]
    assert spare == sorted(spare, reverse=True) and spare[-1] == 0


def test_modes_caps_and_budget():
    cost = affine_cost()
    conf = [0.9, 0.85, 0.5, 0.95, 0.9, 0.9, 0.9]
    pick = lambda mode, cap=7, budget=4096, base=1: choose_verify_lengths(  # noqa: E731
        [Candidate("r", conf, parse_speculation(mode), cap)], base, 1, cost, budget)["r"]
    assert pick("off") == 0
    assert pick("fixed:3") == 3 and pick("fixed:9") == 7 and pick("fixed:5", cap=2) == 2
    assert pick("threshold:0.8") == 2  # stops before the first confidence under 0.8
    assert pick("threshold:0.0") == 7
    assert pick("fixed:7", budget=4, base=1) == 3  # the step's token budget
    assert 0 < pick("adaptive") <= 7


def test_latency_cap():
    cost = affine_cost(t0=0.02, t1=0.001, draft=0.002)
    assert latency_cap(None, cost, 10, 1, 7) == 7
    assert latency_cap(0.0315, cost, 10, 1, 7) == 0  # a step of 10 tokens plus the draft round takes 32 ms
    assert latency_cap(0.0355, cost, 10, 1, 7) == 3
    assert latency_cap(1.0, cost, 10, 1, 7) == 7


def simulate(mode: str, true_accept: float, stated_conf: float, steps=400, seed=0, n_seq=4):
    """Expected tokens per second of `n_seq` sequences on content where each draft is accepted with probability
    `true_accept` while the confidence head claims `stated_conf`. Adaptive mode gates draft rounds as the engine
    does (DraftGate, scored by each drafted step's goodput against a plain step)."""
    rng = random.Random(seed)
    cost = affine_cost(t0=0.02, t1=0.002, draft=0.004)
    tracker, gate = AcceptanceTracker(7), DraftGate()
    spec = parse_speculation(mode)
    tokens_out, seconds = 0, 0.0
    for _ in range(steps):
        draft = spec.kind != "off" and not (spec.kind == "fixed" and spec.k == 0)
        if spec.kind == "adaptive":
            draft = gate.should_draft(n_seq)
        if not draft:
            seconds += cost.step_seconds(n_seq)
            tokens_out += n_seq
            if spec.kind == "adaptive":
                gate.record_plain(n_seq, cost.step_seconds(n_seq), cost.step_seconds(n_seq))
            continue
        cands = [Candidate(i, [stated_conf] * 7, spec, 7) for i in range(n_seq)]
        corrected = {c.key: tracker.corrected(c.key, c.confidences) for c in cands}
        lengths = choose_verify_lengths(cands, n_seq, n_seq, cost, budget=4096, corrected=corrected)
        step = cost.step_seconds(n_seq + sum(lengths.values()), n_seq)
        emitted = 0
        for c in cands:
            acc = 0
            while acc < lengths[c.key] and rng.random() < true_accept:
                acc += 1
            tracker.record(c.key, c.confidences, lengths[c.key], acc)
            emitted += 1 + acc
        if spec.kind == "adaptive":
            gate.record(n_seq, emitted, step, cost.step_seconds(n_seq))
        seconds += step
        tokens_out += emitted
    return tokens_out / seconds


@pytest.mark.parametrize("true_accept", [0.25, 0.5, 0.9])
def test_adaptive_with_correction_does_not_lose_to_a_fixed_cap(true_accept):
    """A head that says 0.9 everywhere: on hard content (low real acceptance) a confidence threshold verifies the
    whole block and loses; the corrected adaptive controller stays within 5% of the best fixed cap."""
    fixed = {k: simulate(f"fixed:{k}", true_accept, 0.9) for k in range(0, 8)}
    adaptive = simulate("adaptive", true_accept, 0.9)
    assert adaptive >= 0.95 * max(fixed.values()), (adaptive, fixed)
    if true_accept <= 0.25:
        assert simulate("threshold:0.8", true_accept, 0.9) < 0.9 * max(fixed.values())


def test_draft_gate_closes_where_drafting_lost_and_probes_in_proportion_to_the_loss():
    gate = DraftGate(probe_every=4)
    assert gate.should_draft(64) and gate.should_draft(1)  # no evidence yet: try
    gate.record(64, emitted=70, seconds=0.15, plain_seconds=0.10)  # 70/0.15 tok/s vs 64/0.10: lost 27%
    gate.record(1, emitted=1, seconds=0.03, plain_seconds=0.025)  # lost too, but one sequence's step proves little
    assert not gate.is_open(64) and gate.is_open(1) and gate.is_open(50)  # 50: another load bucket (32..63)
    drafts = [gate.should_draft(64) for _ in range(200)]
    first = drafts.index(True) + 1
    # A probe's 70 tokens take 0.15 s, where plain decoding would take 70/64 steps of 0.10 s: it loses 0.41 of a
    # plain step, so one in 81 steps keeps the loss at 0.5% of the time.
    assert first == 81
    assert drafts[first:].index(True) + 1 == first
    heavy = DraftGate()
    heavy.record(64, emitted=64, seconds=0.3, plain_seconds=0.1)  # drafting tripled the step: probe rarely
    assert heavy.steps_until_probe(64) == 400  # a probe lost 2 plain steps: 2 / 0.5%
    for _ in range(6):  # the content got easy: probes win, the gate reopens
        gate.record(64, emitted=160, seconds=0.15, plain_seconds=0.10)
    assert gate.is_open(64)
    decisions = [gate.should_draft(64) for _ in range(12)]  # drafting, with control steps to measure plain ones
    assert decisions.count(True) >= 8, decisions


def test_draft_gate_judges_a_probe_without_its_context_catch_up_but_spaces_probes_by_it():
    """A probe first appends the context its sequences missed while the bucket decoded plainly. Leaving that out,
    a round that wins in steady drafting reopens the bucket although the probe step as a whole lost; and a losing
    bucket's probes are spaced by what they really cost, catch-up included."""
    gate = DraftGate()
    for _ in range(4):  # 16 sequences, 64 sequence-steps: drafting lost 27%
        gate.record(16, emitted=22, seconds=0.030, plain_seconds=0.020)
    assert not gate.is_open(16)
    # The content turned easy: 40 tokens in 30 ms of drafting against 16 in 20 ms plainly (1.67x), but 60 ms went
    # to the catch-up, so the whole step (90 ms) lost.
    gate.record(16, emitted=40, seconds=0.090, plain_seconds=0.020, catch_up_seconds=0.060)
    assert gate.is_open(16)
    losing = DraftGate()
    losing.record(64, emitted=64, seconds=0.3, plain_seconds=0.1, catch_up_seconds=0.1)
    assert losing.score(64) == pytest.approx(0.5)  # the steady round: 2 plain steps' time for one's tokens
    assert losing.steps_until_probe(64) == 400  # the probe took 3 plain steps' time for 1 step's tokens: 2 / 0.5%


def test_draft_gate_reopens_only_clear_of_a_tie():
    """Closed at a score of 1 or below, a bucket reopens only above 1 + reopen_margin, so a near-tie whose noisy
    score wanders across 1 does not flip it open on a few lucky probes."""
    gate = DraftGate()
    for _ in range(4):  # 16 sequences: 0.95x
        gate.record(16, emitted=19, seconds=0.020, plain_seconds=0.016)
    assert gate.score(16) == pytest.approx(0.95) and not gate.is_open(16)
    while gate.score(16) <= 1.0:
        gate.record(16, emitted=20.5, seconds=0.020, plain_seconds=0.016)  # 1.025x
    assert 1.0 < gate.score(16) <= 1.0 + gate.reopen_margin and not gate.is_open(16)
    while gate.score(16) <= 1.0 + gate.reopen_margin:
        gate.record(16, emitted=22, seconds=0.020, plain_seconds=0.016)  # 1.1x: clear of the tie
    assert gate.is_open(16)
    gate.record(16, emitted=20.5, seconds=0.020, plain_seconds=0.016)  # open, a 1.025x step keeps it open
    assert gate.is_open(16)


def test_draft_gate_starts_a_load_above_a_losing_one_closed():
    """Drafting pays less as load grows, so a bucket with no evidence of its own above one that closed starts closed
    (probing at the lower bucket's spacing) instead of drafting to explore; below it, and above an open one, a new
    bucket still explores; and its own evidence decides once it has enough."""
    gate = DraftGate()
    for _ in range(4):  # 16 sequences, 64 sequence-steps: drafting lost 27%
        gate.record(16, emitted=22, seconds=0.030, plain_seconds=0.020)
    assert not gate.is_open(16)
    assert not gate.is_open(40)  # 32..63: nothing measured there, judged by 16..31
    assert gate.is_open(8) and gate.should_draft(8)  # below: explores
    assert gate.steps_until_probe(40) == gate.steps_until_probe(16) > 1
    drafts = [gate.should_draft(40) for _ in range(gate.steps_until_probe(16))]
    assert drafts.count(True) == 1 and drafts[-1]  # a probe, spaced as the bucket below would space it
    for _ in range(2):  # at 40 sequences drafting wins (content turned easy): its own evidence decides
        gate.record(40, emitted=100, seconds=0.030, plain_seconds=0.020)
    assert gate.is_open(40) and not gate.is_open(16)

    winning = DraftGate()
    for _ in range(4):
        winning.record(16, emitted=40, seconds=0.030, plain_seconds=0.020)
    assert winning.is_open(16) and winning.is_open(40)  # above an open bucket: explore

    # Spaced by the bucket below, but a probe costs what it costs at this load: one sequence lost 10% (a probe every
    # 33 steps), while a probe of 4 sequences, its contexts caught up, took 3 plain steps' time for one step's tokens.
    mild = DraftGate()
    for _ in range(64):
        mild.record(1, emitted=1.5, seconds=0.020, plain_seconds=0.012)
    assert not mild.is_open(1) and mild.steps_until_probe(4) == mild.steps_until_probe(1) == 33
    mild.record(4, emitted=4, seconds=0.036, plain_seconds=0.012, catch_up_seconds=0.012)
    assert not mild.is_open(4) and mild.steps_until_probe(4) == 400  # 2 plain steps lost / 0.5%


def test_draft_gate_weighs_a_step_by_its_sequences():
    """One sequence's step says little (it emits 1 to gamma + 1 tokens): a lucky probe does not reopen a bucket that
    lost over many steps at one sequence, while a 64-sequence probe that won as clearly does."""
    for n, reopens in ((1, False), (64, True)):
        gate = DraftGate()
        for _ in range(200):  # drafting lost 10%: 1.5 tokens per sequence in 20 ms against one in 12 ms
            gate.should_draft(n)
            gate.record(n, emitted=1.5 * n, seconds=0.020, plain_seconds=0.012)
        assert gate.score(n) == pytest.approx(0.9) and not gate.is_open(n)
        while not gate.should_draft(n):
            pass
        gate.record(n, emitted=4 * n, seconds=0.020, plain_seconds=0.012)  # a probe that won 2.4x
        assert gate.is_open(n) == reopens, (n, gate.score(n))


def test_draft_gate_gives_fresh_content_a_trial_at_low_load():
    """At one sequence a bucket closed by an answer that drafted poorly is tried afresh when a new answer arrives:
    trial_steps drafted steps in a row, scored on their own. A winning trial replaces the old evidence and reopens the
    bucket; a losing one leaves it closed. No trial without fresh sequences, or above trial_max_seqs."""
    def closed_gate(n):
        gate = DraftGate()
        for _ in range(200):  # drafting lost 10%: 1.5 tokens per sequence in 20 ms against one in 12 ms
            gate.should_draft(n)
            gate.record(n, emitted=1.5 * n, seconds=0.020, plain_seconds=0.012)
        assert not gate.is_open(n)
        return gate

    for tokens, reopens in ((2.5, True), (1.5, False)):  # the new answer drafts 1.5x better than plain, or as before
        gate = closed_gate(1)
        assert not gate.should_draft(1, fresh=0)  # the same answer: wait for a probe
        trial = [gate.should_draft(1, fresh=1 if i == 0 else 0) for i in range(gate.trial_steps)]
        assert trial == [True] * gate.trial_steps
        for _ in trial:
            gate.record(1, emitted=tokens, seconds=0.020, plain_seconds=0.012)
        assert gate.is_open(1) == reopens, gate.score(1)
        if reopens:
            assert gate.score(1) == pytest.approx(1.5)  # the trial's evidence alone
            gate.record(1, emitted=1.0, seconds=0.020, plain_seconds=0.012)  # one poor step does not close it
            assert gate.is_open(1)
        else:
            assert gate.score(1) == pytest.approx(0.9) and not gate.should_draft(1, fresh=0)
    busy = closed_gate(4)  # four answers share the batch: no trial, the probes' spacing holds
    assert not busy.should_draft(4, fresh=4)


def test_draft_gate_measures_plain_steps_and_runs_control_steps_while_open():
    """The plain side is measured, not only predicted: a cost curve that predicts plain steps 25% slow makes a
    losing draft round look like a win until a plain control step measures the truth."""
    gate = DraftGate()
    decisions = []
    for _ in range(40):  # drafted steps emit 70 tokens for 64 sequences in 0.10 s; plain steps take 0.08 s
        decisions.append(gate.should_draft(64))
        if decisions[-1]:
            gate.record(64, emitted=70, seconds=0.10, plain_seconds=0.10)  # the curve predicts 0.10 s
        else:
            gate.record_plain(64, seconds=0.08, predicted_seconds=0.10)
        if len(decisions) == 2:
            assert gate.score(64) == pytest.approx(70 / 64) and gate.is_open(64)  # by the prediction: a 9% win
    assert decisions[:3] == [True, True, False], decisions  # no plain step measured at this load yet: check soon
    assert gate.plain_bias(64) == pytest.approx(0.8)
    assert gate.score(64) == pytest.approx(70 / 64 * 0.8) and not gate.is_open(64)  # a 12.5% loss: closed
    assert decisions[3:].count(True) == 1  # then it probes: one in (70/64) x (1/0.875 - 1) / 0.5% = 31, of 37
    assert gate.plain_bias(16) == 1.0  # other buckets keep their own calibration

    # A real 9% win, plain steps measured: control steps are spaced so that they lose <= 0.5% (8.6% each: one after
    # every 17 drafted steps).
    win = DraftGate()
    for _ in range(3):
        win.record_plain(64, seconds=0.10, predicted_seconds=0.10)
    decisions = []
    for _ in range(40):
        decisions.append(win.should_draft(64))
        if decisions[-1]:
            win.record(64, emitted=70, seconds=0.10, plain_seconds=0.10)
        else:
            win.record_plain(64, seconds=0.10, predicted_seconds=0.10)
    assert win.is_open(64) and decisions.count(False) == 40 // 18, decisions


def test_step_cost_model_tracks_measurements():
    curve = Curve([1, 16, 64], [0.02, 0.03, 0.05], alpha=0.5)
    for _ in range(30):
        curve.observe(16, 0.04)
    assert curve.at(16) == pytest.approx(0.04, rel=1e-3)
    assert curve.at(1) < curve.at(8) < curve.at(16) < curve.at(64)
    assert curve.at(128) == pytest.approx(2 * curve.at(64))
    # Steps between grid points correct the curve where they land (moving each neighbour towards the observed time
    # instead left the curve 18% high at 40 tokens here).
    truth = lambda b: 0.02 + 0.001 * b  # noqa: E731
    line = Curve([1, 16, 64, 128], [truth(1), truth(16), 0.5 * truth(64), truth(128)], alpha=0.2)
    for _ in range(1000):
        for b in (8, 40, 100, 120):
            line.observe(b, truth(b))
    for b in (8, 40, 100, 120):
        assert line.at(b) == pytest.approx(truth(b), rel=0.01), b
    cost = StepCostModel(curve, Curve([1, 64], [0.004, 0.010]))
    assert cost.step_seconds(16, 0) == pytest.approx(0.04, rel=1e-3)
    assert cost.step_seconds(16, 64) == pytest.approx(0.05, rel=1e-3)


def test_curve_follows_the_machine_speed_at_every_point():
    """The machine slows down 2x while only 1-token steps run (concurrency 1, nothing verified): the points not
    seen slow down with it, so the curve's slope, which Algorithm 1 weighs, keeps its shape."""
    grid, base = [1, 2, 4, 8, 16, 64], [0.020, 0.021, 0.022, 0.024, 0.030, 0.050]
    curve = Curve(grid, list(base))
    for _ in range(50):
        curve.observe(1, 0.040)
    assert curve.at(1) == pytest.approx(0.040, rel=0.05)
    for x, b in zip(grid[1:], base[1:]):
        assert 1.7 < curve.at(x) / b <= 2.0, (x, curve.at(x) / b)
    # 7 more tokens cost 20% more in truth. Points that kept their old speed would read 8 tokens as cheaper than 1
    # (flattened to a free ride by the monotone fit); with the factor most of the slope remains.
    slope = (curve.at(8) - curve.at(1)) / curve.at(1)
    assert 0.08 < slope <= 0.2, slope


def test_isotonic_matches_brute_force_least_squares():
    rng = random.Random(3)
    for _ in range(200):
        values = [round(rng.uniform(0, 1), 1) for _ in range(rng.randint(1, 6))]
        fit = isotonic(values)
        assert all(a <= b + 1e-12 for a, b in zip(fit, fit[1:]))
        # The best non-decreasing fit on a fine grid of levels is no better than PAVA's.
        levels = [i / 20 for i in range(21)]
        best = min(sum((v - f) ** 2 for v, f in zip(values, fs))
                   for fs in itertools.combinations_with_replacement(levels, len(values)))
        assert sum((v - f) ** 2 for v, f in zip(values, fit)) <= best + 1e-9


def test_curve_reads_are_monotone_and_admission_ignores_a_noisy_dip():
    """A forward of 2 tokens measured faster than one of 1 (noise) must not make verifying look free."""
    noisy = Curve([1, 2, 4, 8], [0.0317, 0.0246, 0.0323, 0.0312])
    reads = [noisy.at(x) for x in range(1, 12)]
    assert all(a <= b for a, b in zip(reads, reads[1:])), reads
    assert noisy.seconds == [0.0317, 0.0246, 0.0323, 0.0312]  # the raw points still follow the data
    for _ in range(200):
        for x, t in ((1, 0.020), (2, 0.021), (4, 0.023), (8, 0.027)):
            noisy.observe(x, t)
    assert [round(noisy.at(x), 4) for x in (1, 2, 4, 8)] == [0.020, 0.021, 0.023, 0.027]
