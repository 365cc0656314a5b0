"""The step-cost model: curves that follow measured steps and read monotone."""
from __future__ import annotations

import itertools
import random

import pytest

from engine.step_cost import Curve, StepCostModel, isotonic


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
    for _ in range(1000):  # the 1-token point is the anchor: the others learn their ratios to it, 30% here
        for x, t in ((1, 0.020), (2, 0.021), (4, 0.023), (8, 0.027)):
            noisy.observe(x, t)
    assert [round(noisy.at(x), 4) for x in (1, 2, 4, 8)] == [0.020, 0.021, 0.023, 0.027]


def sweep_seeded_curve(truth, grid=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), context=64):
    """A forward curve seeded as the engine's start-up sweep seeds it: each point timed with `context` cached tokens
    per sequence (at most 64 sequences), so its points still hold that KV read."""
    return Curve(list(grid), [truth(b, context * min(b, 64)) for b in grid])


def random_steps(rng, n):
    """(tokens, KV read) of `n` steps: 1 to 64 decoding sequences, up to 3 verify tokens each, contexts 16-2000."""
    for _ in range(n):
        seqs = rng.choice([1, 2, 4, 8, 16, 32, 64])
        yield seqs + rng.randint(0, 3 * seqs), sum(rng.randint(16, 2000) for _ in range(seqs))


@pytest.mark.parametrize("noise", [0.0, 0.05])
def test_kv_fit_recovers_known_coefficients(noise):
    """Steps cost t0 + t1 * tokens + k * KV read. From a sweep that timed every point at one context, the curve
    learns k, unlearns the sweep's KV from its points, and predicts unseen steps; then the machine slows down 2x and
    the KV part slows with it."""
    k = 2e-6
    truth = lambda b, kv: 0.02 + 0.0004 * b + k * kv  # noqa: E731
    rng = random.Random(7)
    curve = sweep_seeded_curve(truth)
    for b, kv in random_steps(rng, 10000):
        curve.observe(b, truth(b, kv) * (1 + noise * rng.gauss(0, 1)), kv)
    tol = 0.02 + noise
    assert curve.scale * curve.kv_coef == pytest.approx(k, rel=tol)
    for b, kv in ((1, 50), (1, 2000), (8, 9000), (64, 60000), (200, 10000)):
        assert curve.at(b, kv) == pytest.approx(truth(b, kv), rel=tol), (b, kv)
    for b, kv in random_steps(rng, 600):  # the slope follows within its window (about 10 / alpha steps)
        curve.observe(b, 2 * truth(b, kv) * (1 + noise * rng.gauss(0, 1)), kv)
    assert curve.at(8, 30000) - curve.at(8, 10000) == pytest.approx(2 * k * 20000, rel=tol + 0.03)


def one_stream_steps(rng, requests):
    """(tokens, KV read) of one request at a time, as a server with one client runs them: a prefill of 30-300 prompt
    tokens (no KV read), then 64 decode steps reading the growing context, one in ten verifying a draft."""
    for _ in range(requests):
        prompt = rng.randint(30, 300)
        yield prompt, 0
        for i in range(64):
            yield 1 + (rng.random() < 0.1), prompt + i


@pytest.mark.parametrize("noise", [0.0, 0.05, 0.15])
def test_kv_fit_stays_put_when_only_prefills_read_no_kv(noise):
    """At one stream the KV read and the step size move together (prefills read none, decodes all of it). A slope
    pooled over all steps fed back through the 1-token point until the point went negative and the speed factor ran
    away (on a real engine plain steps came to be predicted at two to three times their time, later at minus
    seconds; see the commit that added this test). The curve must stay on the data, and find the KV coefficient
    where the steps are exact."""
    k = 5e-6
    truth = lambda b, kv: 0.012 + 0.0014 * (b - 1) + k * kv  # noqa: E731
    rng = random.Random(3)
    curve = sweep_seeded_curve(truth, context=16)
    errors = []
    for i, (b, kv) in enumerate(one_stream_steps(rng, 150)):
        curve.observe(b, truth(b, kv) * (1 + noise * rng.gauss(0, 1)), kv)
        if i > 500 and b == 1:
            errors.append(abs(curve.at(1, kv) / truth(1, kv) - 1))
    errors.sort()
    assert errors[len(errors) // 2] < 0.05 and errors[int(0.99 * len(errors))] < 0.02 + 3 * noise, errors[-5:]
    assert errors[-1] < 0.5  # single noisy steps move it, nothing runs away
    assert 0.5 < curve.scale < 2.0
    if noise == 0.0:
        assert curve.scale * curve.kv_coef == pytest.approx(k, rel=0.1)


def test_prediction_grows_with_context():
    cost = StepCostModel(Curve([1, 64], [0.02, 0.05], kv_coef=1e-6), Curve([1, 64], [0.004, 0.010]))
    for tokens, drafted in ((1, 0), (16, 4), (64, 64)):
        reads = [cost.step_seconds(tokens, drafted, kv) for kv in (0, 100, 1000, 10000, 100000)]
        assert reads == sorted(set(reads)), reads  # strictly increasing
        assert reads[-1] - reads[0] == pytest.approx(1e-6 * 100000)
        assert cost.sps(tokens, drafted, 100000) < cost.sps(tokens, drafted, 0)


def test_without_a_kv_cost_the_model_is_the_token_model():
    """A zero KV coefficient reads the token curve at any context; steps whose time does not depend on the KV read
    leave the coefficient at (or near) zero, and the curve predicts as one that was never told the KV read."""
    flat = StepCostModel(Curve([1, 64], [0.02, 0.05]), Curve([1, 64], [0.004, 0.010]))
    assert all(flat.step_seconds(16, 4, kv) == flat.step_seconds(16, 4) for kv in (0, 1, 10**6))
    truth = lambda b: 0.02 + 0.0004 * b  # noqa: E731
    grid = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    exact_told, exact_blind, rough_told, rough_blind = (Curve(grid, [f * truth(b) for b in grid])
                                                        for f in (1.0, 1.0, 0.8, 0.8))
    rng = random.Random(11)
    for b, kv in random_steps(rng, 3000):
        exact_told.observe(b, truth(b), kv)
        exact_blind.observe(b, truth(b))
        rough_told.observe(b, truth(b), kv)
        rough_blind.observe(b, truth(b))
    assert rough_told.kv_coef * 64 * 1000 < 0.01 * truth(64)  # a full batch's KV read: under 1% of its step
    for b in (1, 8, 64, 200):
        kv = 1000 * min(b, 64)
        assert exact_told.at(b, kv) == pytest.approx(exact_blind.at(b), rel=1e-12)  # rounding apart
        assert rough_told.at(b, kv) == pytest.approx(rough_blind.at(b), rel=0.01)
