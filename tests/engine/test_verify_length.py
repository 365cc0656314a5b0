"""The verify-length choice (Algorithm 1 and the fixed/threshold modes) as a pure function of plain numbers."""
from __future__ import annotations

import itertools
import random

import pytest

from engine.acceptance import AcceptanceTracker, survival
from engine.draft_gate import DraftGate
from engine.spec_mode import SpecMode, parse_speculation
from engine.step_cost import Curve, StepCostModel
from engine.verify_length import Candidate, choose_verify_lengths, latency_cap

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


def affine_kv_cost(rng) -> StepCostModel:
    """A random affine forward (per step, per token, per cached token read) and a flat draft round."""
    cost = affine_cost(t0=rng.uniform(0.005, 0.05), t1=rng.uniform(1e-5, 5e-3), draft=rng.uniform(0, 0.01))
    cost.forward.kv_coef = rng.choice([0.0, rng.uniform(0, 1e-5)])
    return cost


def test_queue_and_context_match_brute_force_on_small_cases():
    """With requests waiting and a KV read, Algorithm 1 still finds the best lengths of its objective: the tokens
    per second of the decoding sequences and of the queue (one token per step each), at the step's full cost."""
    rng = random.Random(5)
    for trial in range(300):
        gamma, n = rng.randint(1, 4), rng.randint(1, 3)
        cands = [Candidate(i, [rng.uniform(0.05, 1.0) for _ in range(gamma)], ADAPTIVE, gamma) for i in range(n)]
        base, waiting, kv = n + rng.randint(0, 40), rng.choice([0, 1, 3, 10, 50]), rng.randint(0, 20000)
        cost = affine_kv_cost(rng)

        def objective(lengths):
            tau = n + waiting + sum(sum(survival(c.confidences[: lengths[c.key]])) for c in cands)
            return tau * cost.sps(base + sum(lengths.values()), n, kv)

        got = choose_verify_lengths(cands, base, n, cost, budget=10**6, waiting=waiting, kv_tokens=kv)
        best = max(objective(dict(zip(range(n), ls))) for ls in itertools.product(range(gamma + 1), repeat=n))
        assert objective(got) == pytest.approx(best, rel=1e-9), trial


def random_step(rng):
    """Candidates of every mode with their caps, corrections and the step around them, as plain numbers."""
    n, gamma = rng.randint(1, 12), 7
    modes = [ADAPTIVE] * 4 + [parse_speculation(m) for m in ("fixed:3", "threshold:0.6", "off")]
    cands = [Candidate(i, [rng.uniform(0.3, 1.0) for _ in range(gamma)], rng.choice(modes), rng.randint(0, gamma))
             for i in range(n)]
    corrected = {c.key: [x * rng.uniform(0.5, 1.1) for x in c.confidences] for c in cands if rng.random() < 0.5}
    return dict(cands=cands, base_tokens=n + rng.choice([0, 0, 20, 200]), num_decoding=n, cost=affine_kv_cost(rng),
                budget=rng.choice([n + 8, 256, 4096]), corrected=corrected, drafted=rng.randint(0, n))


def test_a_longer_queue_never_lengthens_a_verify():
    """Property over seeded random steps: for fixed everything else, each sequence's verify length is
    non-increasing in the number of waiting requests; the queue does shorten verifies, and an empty queue is the
    plain choice."""
    rng = random.Random(9)
    shortened = 0
    for trial in range(400):
        step, kv = random_step(rng), rng.choice([0, 500, 50000])
        queues = [0, 1, 2, 3, 5, 8, 16, 32, 64, 256, 4096]
        runs = [choose_verify_lengths(**step, waiting=w, kv_tokens=kv) for w in queues]
        assert runs[0] == choose_verify_lengths(**step, kv_tokens=kv)
        for w, shorter, longer in zip(queues[1:], runs[1:], runs):
            assert all(shorter[k] <= longer[k] for k in longer), (trial, w, longer, shorter)
        shortened += sum(runs[-1].values()) < sum(runs[0].values())
    assert shortened > 200, shortened


def test_a_longer_context_never_shortens_a_verify():
    """A step that reads more KV costs more whatever its tokens, so one more verified token costs relatively less:
    for fixed everything else, verify lengths are non-decreasing in the KV read, and do grow with it."""
    rng = random.Random(13)
    lengthened = 0
    for trial in range(300):
        step, waiting = random_step(rng), rng.choice([0, 4])
        step["cost"].forward.kv_coef = rng.uniform(1e-7, 1e-5)
        runs = [choose_verify_lengths(**step, waiting=waiting, kv_tokens=kv) for kv in (0, 100, 1000, 10000, 10**5)]
        for less, more in zip(runs, runs[1:]):
            assert all(more[k] >= less[k] for k in less), (trial, less, more)
        lengthened += sum(runs[-1].values()) > sum(runs[0].values())
    assert lengthened > 100, lengthened


def test_latency_cap_counts_the_kv_read():
    cost = affine_cost(t0=0.02, t1=0.001, draft=0.002)
    cost.forward.kv_coef = 1e-6
    assert latency_cap(0.0355, cost, 10, 1, 7, kv_tokens=0) == 3  # as without a KV read
    assert latency_cap(0.0355, cost, 10, 1, 7, kv_tokens=2000) == 1  # the KV read takes the room of 2 drafts
    assert latency_cap(0.0355, cost, 10, 1, 7, kv_tokens=5000) == 0
