"""The fleet simulator on tiny traces: exact single-request timing, the controller's own decisions inside the
steps, scale-up under a load step and back down, GPU-hours against a fixed fleet, determinism, mean field."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from autoscale.policy import PolicyParams
from autoscale.simulator import FleetSpec, ReplicaSpec, _Shared, simulate
from autoscale.trace import ArrayTrace, LengthDist, SyntheticTrace, diurnal, step_load
from engine.spec_mode import SpecMode
from engine.verify_length import Candidate, choose_verify_lengths

# A small replica (32 sequences) and short requests keep these runs to about a second.
SMALL = ReplicaSpec(max_num_seqs=32, max_num_batched_tokens=512, kv_capacity_tokens=100_000)
PROMPT, OUTPUT = LengthDist(64, 0.5, 4, 512), LengthDist(48, 0.5, 2, 256)
FAST = FleetSpec(startup_s=20, control_interval_s=2, look_back_s=10, stats_window_s=100, max_simulated=8)
POLICY = PolicyParams(upscale_delay_s=10, downscale_delay_s=60, up_cooldown_s=15, down_cooldown_s=15,
                      drain_horizon_s=30, trend_s=6, token_budget=512, max_replicas=8)


@pytest.fixture(scope="module")
def step_runs():
    """10 req/s, a step to 120 req/s for 200 s (one replica holds about 50), then 10 again."""
    trace = SyntheticTrace(step_load(10, 120, 100, 300), 600, PROMPT, OUTPUT)
    auto = simulate(trace, SMALL, FAST, POLICY, replicas=1, seed=3)
    # the fixed fleet as mean field (one replica simulated for all): same GPU-hours, a third of the work
    fixed = simulate(trace, SMALL, replace(FAST, max_simulated=1), None, replicas=max(auto.timeline["ready"]),
                     seed=3)
    return trace, auto, fixed


def at(res, t0, t1, key):
    tl = res.timeline
    return [v for t, v in zip(tl["t"], tl[key]) if t0 <= t < t1]


def test_scales_up_under_a_load_step_and_back_down(step_runs):
    _, auto, _ = step_runs
    assert max(at(auto, 0, 100, "target")) == 1
    assert max(at(auto, 100, 300, "ready")) >= 3  # 120 req/s needs 3 replicas of ~50
    assert at(auto, 590, 600, "target")[-1] <= 2
    ups = [d for d in auto.decisions if d[2] > d[1]]
    downs = [d for d in auto.decisions if d[2] < d[1]]
    assert ups and all(100 < t < 300 for t, *_ in ups)
    assert downs and all(t > 300 or b >= 3 for t, _, b, _ in downs)  # overshoot trimmed, never below the need
    assert all(a - b == 1 for _, a, b, _ in downs)  # one step at a time
    assert auto.rejected == 0 and auto.aborted == 0


def test_gpu_hours_below_the_fixed_fleet_and_latencies_sane(step_runs):
    _, auto, fixed = step_runs
    assert auto.gpu_hours < 0.8 * fixed.gpu_hours
    assert fixed.gpu_hours == pytest.approx(max(auto.timeline["ready"]) * 600 / 3600)
    for res in (auto, fixed):
        o = res.overall
        assert all(math.isfinite(v) and v > 0 for k, v in o.items() if k.endswith("_s"))
        assert 0.005 < o["ttft_p50_s"] < 1.0 and 0.002 < o["tpot_p50_s"] < 0.1
        assert o["ttft_p50_s"] <= o["ttft_p99_s"] and o["tpot_p50_s"] <= o["tpot_p99_s"]
        assert o["requests"] == res.completed
    # the fixed fleet never queues; the autoscaled one pays for the step with a backlog while replicas start
    assert fixed.overall["ttft_p99_s"] < 0.5
    assert auto.overall["ttft_p99_s"] > fixed.overall["ttft_p99_s"]
    # nearly every request of the trace is served (a few may still run at the end)
    assert auto.completed == pytest.approx(auto.represented_requests, rel=0.01)


def test_single_request_timing_is_exact():
    """No speculation, one request on an idle replica: TTFT is the prefill step, TPOT the B=1 decode step."""
    spec = ReplicaSpec(speculation="off")
    res = simulate(ArrayTrace([0.5], [300], [11]), spec, FleetSpec(stats_window_s=10), None, replicas=1,
                   duration_s=10)
    cost = spec.cost_model()
    o = res.overall
    ratio = 10 ** (7 / 700)  # histogram bin width
    assert o["requests"] == 1
    assert o["ttft_p50_s"] == pytest.approx(cost.step_seconds(300), rel=ratio - 1)
    assert o["tpot_p50_s"] == pytest.approx(cost.step_seconds(1), rel=ratio - 1)
    assert o["e2e_p50_s"] == pytest.approx(cost.step_seconds(300) + 10 * cost.step_seconds(1), rel=ratio - 1)


def test_in_sim_verify_lengths_are_the_controllers():
    spec = ReplicaSpec()
    mode = SpecMode("adaptive")
    cost = spec.cost_model()
    for quantum in (1, 32):
        sh = _Shared(spec, quantum, np.random.default_rng(0))
        for n, tokens in ((1, 1), (8, 300), (64, 64), (200, 900), (256, 2000)):
            lens, total = sh.lengths(n, tokens)
            key_tokens = max(n, (tokens + quantum // 2) // quantum * quantum)
            want = choose_verify_lengths([Candidate(i, list(spec.acceptance), mode, len(spec.acceptance))
                                          for i in range(n)], key_tokens, n, cost, spec.max_num_batched_tokens)
            assert lens.tolist() == [want[i] for i in range(n)] and total == sum(want.values())


def test_verify_length_shrinks_as_load_grows():
    """The same controller as the engine's: more load, fewer drafts verified per sequence, and more steps where
    speculation is squeezed out."""
    vps, squeezed = [], []
    for rate in (2, 12, 30):
        res = simulate(SyntheticTrace(step_load(rate, rate, 0, 1), 45), ReplicaSpec(), FleetSpec(max_simulated=1),
                       None, replicas=1, seed=1)
        vps.append(np.mean(at(res, 15, 45, "verify_tokens_per_seq")))
        squeezed.append(np.mean(at(res, 15, 45, "spec_squeezed")))
    assert vps[0] > vps[1] > vps[2]
    assert vps[0] > 5.5 and vps[2] < 3.5
    assert squeezed[0] <= squeezed[1] <= squeezed[2] and squeezed[2] > 0.05


def test_deterministic_for_a_seed():
    trace = SyntheticTrace(step_load(20, 60, 30, 90), 120, PROMPT, OUTPUT)
    runs = [simulate(trace, SMALL, FAST, POLICY, replicas=1, seed=s) for s in (7, 7, 8)]
    assert runs[0].to_json() == runs[1].to_json()
    assert runs[0].to_json() != runs[2].to_json()


def test_mean_field_fleet_simulates_a_share():
    """A fixed fleet of 6 with 2 simulated: they see a third of the traffic, the GPU-hours are the fleet's."""
    trace = SyntheticTrace(step_load(120, 120, 0, 1), 120, PROMPT, OUTPUT)
    res = simulate(trace, SMALL, FleetSpec(max_simulated=2, control_interval_s=2), None, replicas=6, seed=0)
    assert res.gpu_hours == pytest.approx(6 * 120 / 3600)
    assert res.represented_requests == pytest.approx(120 * 120, rel=0.05)
    assert res.completed == pytest.approx(120 * 120 / 3, rel=0.07)


def test_simulate_rejects_an_empty_fleet():
    with pytest.raises(ValueError):
        simulate(ArrayTrace([0.0], [10], [10]), replicas=0, policy=None)


# ----- traces ----------------------------------------------------------------------------------------------------


def test_diurnal_rate_shape():
    rate = diurnal(peak=3000, trough_frac=0.05, noise=0.0)
    assert rate(np.array([0.0]))[0] == pytest.approx(150)
    assert rate(np.array([43200.0]))[0] == pytest.approx(3000)
    assert rate(np.array([21600.0]))[0] == pytest.approx(1575)
    noisy = diurnal(peak=3000, noise=0.1, seed=1)(np.linspace(0, 86400, 1000))
    assert 0.8 < noisy.max() / 3000 < 1.4 and noisy.min() > 0


def test_synthetic_arrivals_follow_the_rate_and_fraction():
    trace = SyntheticTrace(step_load(50, 50, 0, 1), 200)
    rng = np.random.default_rng(0)
    times, prompts, outputs = trace.arrivals(0, 200, 0.25, rng)
    assert len(times) == pytest.approx(50 * 200 * 0.25, rel=0.1)
    assert np.all(np.diff(times) >= 0) and times.min() >= 0 and times.max() < 200
    assert prompts.min() >= trace.prompt.lo and outputs.max() <= trace.output.hi
    assert np.median(outputs) == pytest.approx(trace.output.median, rel=0.1)


def test_array_trace_replays_and_thins():
    trace = ArrayTrace([3.0, 1.0, 2.0, 5.0], [10, 20, 30, 40], [1, 2, 3, 4])
    times, prompts, _ = trace.arrivals(1.0, 5.0, 1.0, np.random.default_rng(0))
    assert times.tolist() == [1.0, 2.0, 3.0] and prompts.tolist() == [20, 30, 10]
    kept = trace.arrivals(0, 10, 0.5, np.random.default_rng(0))[0]
    assert set(kept.tolist()) <= {1.0, 2.0, 3.0, 5.0}
