"""The draft gate: when a draft round pays at a load, judged by drafted steps' goodput against plain steps'."""
from __future__ import annotations

import pytest

from engine.draft_gate import DraftGate


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
