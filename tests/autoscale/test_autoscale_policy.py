"""The dspark autoscaling policy: the pure `decide` over plain numbers, and its Serve adapter over real
AutoscalingContext objects (and through Serve's own wrapper, which adds factors, delays and bounds)."""
from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace

import pytest

from autoscale.policy import (METRICS, DSparkPolicy, LoadSignals, PolicyParams, PolicyState, decide, dspark_policy,
                              signals_from_metrics, wanted_replicas)

# Thresholds pinned here (the defaults are tuned in the simulator and may move).
P = PolicyParams(queue_up=4, squeeze_up=0.5, occ_up=0.85, kv_up=0.9, target_occupancy=0.7, occ_down=0.5,
                 queue_down=0.5, squeeze_down=0.1, kv_down=0.6, upscale_delay_s=30, downscale_delay_s=300,
                 up_cooldown_s=60, down_cooldown_s=60, drain_horizon_s=180, trend_s=20, start_timeout_s=600,
                 max_num_seqs=256, token_budget=2048)
QUIET = dict(queue_depth=0.5, running=128, seq_occupancy=0.5, token_occupancy=0.5)  # busy, not hot, not idle
HOT_QUEUE = dict(queue_depth=20, running=256, seq_occupancy=1.0, token_occupancy=0.9)
SQUEEZED = dict(queue_depth=1, running=230, seq_occupancy=0.9, token_occupancy=0.8, spec_squeezed=0.6)
IDLE = dict(queue_depth=0, running=20, seq_occupancy=0.08, token_occupancy=0.1)


def sig(n: int = 4, ready: int | None = None, reporting: int | None = None, lo: int = 1, hi: int = 100,
        **metrics) -> LoadSignals:
    ready = n if ready is None else ready
    return LoadSignals(ready=ready, target=n, reporting=ready if reporting is None else reporting, min_replicas=lo,
                       max_replicas=hi, **metrics)


def drive(steps, n: int = 4, params: PolicyParams = P, state: PolicyState = PolicyState(), lo: int = 1,
          hi: int = 100, t0: float = 1000.0, dt: float = 5.0):
    """Call decide every dt seconds; `steps` is a list of metric dicts, or a function (t, n) -> metric dict.
    Replicas start instantly. Returns [(t, n, reason)] and the final state."""
    out = []
    items = steps if isinstance(steps, list) else None
    count = len(items) if items is not None else 2000
    for i in range(count):
        t = t0 + i * dt
        m = items[i] if items is not None else steps(t, n)
        n, state = decide(sig(n, lo=lo, hi=hi, **m), state, params, t)
        out.append((t, n, state.reason))
    return out, state


def changes(trace):
    return [(t, n, r) for (t, n, r), (_, prev, _) in zip(trace[1:], trace) if n != prev]


# ----- single decisions, table-driven ----------------------------------------------------------------------------

# (name, signals, state, now, expected target, reason prefix)
T = 10_000.0
CASES = [
    ("hot queue, delay not over", sig(**HOT_QUEUE), PolicyState(up_since=T - 10), T, 4, "hold"),
    ("hot queue, delay over", sig(**HOT_QUEUE), PolicyState(up_since=T - 30), T, 7, "up:queue"),
    ("first hot call starts the timer", sig(**HOT_QUEUE), PolicyState(), T, 4, "hold"),
    ("squeeze with high occupancy", sig(**SQUEEZED), PolicyState(up_since=T - 40), T, 6, "up:squeeze"),
    ("squeeze at low occupancy is not load", sig(**{**SQUEEZED, "seq_occupancy": 0.5, "token_occupancy": 0.5}),
     PolicyState(up_since=T - 40), T, 4, "hold"),
    ("high occupancy with speculation alive", sig(**{**SQUEEZED, "spec_squeezed": 0.05}),
     PolicyState(up_since=T - 40), T, 4, "hold"),
    ("KV nearly full", sig(**QUIET, kv_usage=0.95), PolicyState(up_since=T - 40), T, 5, "up:kv"),
    ("at max: hold", sig(n=8, hi=8, **HOT_QUEUE), PolicyState(up_since=T - 40), T, 8, "hold:max"),
    ("up capped by max", sig(n=6, hi=7, **HOT_QUEUE), PolicyState(up_since=T - 40), T, 7, "up:queue"),
    ("up within cooldown", sig(**HOT_QUEUE), PolicyState(up_since=T - 40, last_change=T - 20, last_target=4), T, 4,
     "hold"),
    ("up after cooldown", sig(**HOT_QUEUE), PolicyState(up_since=T - 40, last_change=T - 61, last_target=4), T, 7,
     "up:queue"),
    ("replicas still starting: no more", sig(n=6, ready=4, **HOT_QUEUE),
     PolicyState(up_since=T - 40, last_change=T - 100, last_target=6), T, 6, "hold"),
    ("replicas stuck starting: try again", sig(n=6, ready=4, **HOT_QUEUE),
     PolicyState(up_since=T - 40, last_change=T - 700, last_target=6), T, 7, "up:queue"),
    ("idle, delay not over", sig(**IDLE), PolicyState(down_since=T - 200), T, 4, "hold"),
    ("idle, delay over: one step down", sig(**IDLE), PolicyState(down_since=T - 300), T, 3, "down:idle"),
    ("idle at min", sig(n=2, lo=2, **IDLE), PolicyState(down_since=T - 400), T, 2, "hold"),
    ("idle but one fewer would be busy", sig(n=2, **{**IDLE, "seq_occupancy": 0.3}), PolicyState(down_since=T - 400),
     T, 2, "hold"),
    ("idle within cooldown", sig(**IDLE), PolicyState(down_since=T - 400, last_change=T - 30, last_target=4), T, 4,
     "hold"),
    ("idle while replicas start", sig(n=5, ready=4, **IDLE), PolicyState(down_since=T - 400, last_target=5), T, 5,
     "hold"),
    ("to zero only with no load at all", sig(n=1, lo=0, **IDLE), PolicyState(down_since=T - 400), T, 1, "hold"),
    ("no metrics: hold", sig(reporting=0), PolicyState(up_since=T - 100), T, 4, "no metrics"),
    ("below min: raised", sig(n=1, lo=3, **QUIET), PolicyState(), T, 3, "bounds"),
    ("above max: lowered", sig(n=9, hi=6, **QUIET), PolicyState(), T, 6, "bounds"),
    ("busy: hold", sig(**QUIET), PolicyState(up_since=None, down_since=None), T, 4, "hold"),
]


@pytest.mark.parametrize("name,signals,state,now,want,reason", CASES, ids=[c[0] for c in CASES])
def test_decide_table(name, signals, state, now, want, reason):
    n, new_state = decide(signals, state, P, now)
    assert n == want, name
    assert new_state.reason.startswith(reason), (name, new_state.reason)
    assert new_state.last_target == n
    if n != signals.target:
        assert new_state.last_change == now


def test_zero_replicas_allowed_only_when_empty():
    p = replace(P, min_replicas=0)
    empty = dict(queue_depth=0, running=0, seq_occupancy=0, token_occupancy=0)
    assert decide(sig(n=1, lo=0, **empty), PolicyState(down_since=T - 400), p, T)[0] == 0


def test_sizing_from_demand():
    # 4 replicas, 256 running + 100 queued each: (356 * 4) / (256 * 0.7) = 7.95 -> 8
    s = sig(queue_depth=100, running=256, seq_occupancy=1.0, token_occupancy=0.9)
    assert wanted_replicas(s, P) == 8
    # verify tokens are not load: 0.9 token occupancy of which 0.5 is verify -> 0.4; seq 0.5 rules
    s = sig(running=128, seq_occupancy=0.5, token_occupancy=0.9, verify_tokens_per_step=1024)
    assert wanted_replicas(s, P) == math.ceil(0.5 * 4 / 0.7)
    # without a token budget, token occupancy counts whole
    assert wanted_replicas(s, replace(P, token_budget=None)) == math.ceil(0.9 * 4 / 0.7)
    # max_num_seqs inferred from running / seq_occupancy
    s = sig(queue_depth=64, running=64, seq_occupancy=0.5)
    assert wanted_replicas(s, replace(P, max_num_seqs=None)) == math.ceil(128 * 4 / (128 * 0.7))
    # a big backlog: capped at max_up_factor per decision
    n, _ = decide(sig(queue_depth=5000, running=256, seq_occupancy=1.0), PolicyState(up_since=T - 60), P, T)
    assert n == 8


def test_draining_queue_is_not_hot():
    """A queue that empties by itself within the drain horizon needs no new replica."""
    falling = [dict(HOT_QUEUE, queue_depth=max(0.0, 100 - 2 * i)) for i in range(40)]  # -0.4/s: 100 in 250 s
    trace, _ = drive(falling, params=replace(P, drain_horizon_s=300))
    assert not changes(trace)
    trace, _ = drive(falling, params=replace(P, drain_horizon_s=100))  # too slow for this horizon
    assert changes(trace)[0][2] == "up:queue"
    growing = [dict(HOT_QUEUE, queue_depth=10 + 2 * i) for i in range(40)]
    trace, _ = drive(growing)
    assert changes(trace)[0][2] == "up:queue"


# ----- over time -------------------------------------------------------------------------------------------------


def test_scale_up_on_queue_only_after_delay():
    steps = [QUIET] * 4 + [HOT_QUEUE] * 20
    trace, _ = drive(steps)
    (t, n, reason), = changes(trace)[:1]
    assert reason == "up:queue" and n > 4
    assert t - trace[4][0] >= P.upscale_delay_s
    assert t - trace[4][0] < P.upscale_delay_s + 5 + 1e-9


def test_scale_up_on_sustained_squeeze():
    trace, _ = drive([QUIET] * 2 + [SQUEEZED] * 20)
    first = changes(trace)[0]
    assert first[2] == "up:squeeze"
    assert first[0] - trace[2][0] >= P.upscale_delay_s


@pytest.mark.parametrize("hot", [HOT_QUEUE, SQUEEZED, dict(QUIET, kv_usage=0.95)], ids=["queue", "squeeze", "kv"])
def test_no_scale_up_on_brief_spike(hot):
    spike = [QUIET] * 3 + [hot] * 5 + [QUIET] * 10 + [hot] * 5 + [QUIET] * 10  # 25 s spikes, delay 30 s
    trace, _ = drive(spike)
    assert not changes(trace)


def test_scale_down_one_step_at_a_time_never_below_min():
    trace, _ = drive([IDLE] * 400, n=6, lo=3)
    downs = changes(trace)
    assert [n for _, n, _ in downs] == [5, 4, 3]
    assert all(r == "down:idle" for _, _, r in downs)
    assert downs[0][0] - trace[0][0] >= P.downscale_delay_s  # the first waits the delay ...
    gaps = [b[0] - a[0] for a, b in zip(downs, downs[1:])]
    assert all(P.down_cooldown_s <= g < P.downscale_delay_s for g in gaps)  # ... the next ones only the cooldown


def test_respects_max_under_sustained_overload():
    trace, _ = drive([HOT_QUEUE] * 300, n=2, hi=9)
    assert max(n for _, n, _ in trace) == 9
    assert trace[-1][1] == 9


def test_no_oscillation_near_thresholds():
    """A fleet whose demand hovers around what the current size carries neither flaps up nor down: occupancy
    wobbles around the up threshold (0.85) without the squeeze, and the queue around queue_up, for an hour."""
    def hovering(t, n):
        wobble = math.sin(t / 7.0)
        return dict(queue_depth=P.queue_up + 1.5 * wobble, running=200, seq_occupancy=0.85 + 0.05 * wobble,
                    token_occupancy=0.7, spec_squeezed=0.28 + 0.05 * wobble)

    trace, _ = drive(hovering)
    assert len(changes(trace)) == 0


def test_hysteresis_after_scale_up_no_immediate_scale_down():
    """Demand fixed at 3 replicas' worth of slots at full occupancy: the policy scales up once (to target
    occupancy), then stays; it does not walk back down although each replica is now well below occ_up."""
    demand = 3 * 256.0  # sequences

    def load(t, n):
        per = demand / n
        occ = min(1.0, per / 256)
        return dict(queue_depth=max(0.0, per - 256), running=min(per, 256), seq_occupancy=occ, token_occupancy=occ,
                    spec_squeezed=0.6 if occ > 0.9 else 0.1)

    trace, _ = drive(load, n=3)
    ns = [n for _, n, _ in trace]
    assert ns[-1] == 5  # 768 / (256 * 0.7) = 4.3 -> 5
    assert len(changes(trace)) == 1


def test_cooldown_between_changes():
    trace, _ = drive([HOT_QUEUE] * 200, n=2)
    ups = changes(trace)
    assert len(ups) >= 2
    assert all(b[0] - a[0] >= P.up_cooldown_s for a, b in zip(ups, ups[1:]))


def test_external_change_counts_as_a_change():
    _, state = decide(sig(**HOT_QUEUE), PolicyState(up_since=T - 100, last_target=2), P, T)
    assert state.last_change == T  # the target moved from 2 to 4 without us: cooldown starts now


def test_missing_metrics_reset_timers_and_partial_metrics_use_the_reporting_replicas():
    _, state = decide(sig(reporting=0), PolicyState(up_since=T - 100, down_since=T - 100), P, T)
    assert state.up_since is None and state.down_since is None
    # one of four replicas reports, hot: the mean is its value; demand assumes the silent ones carry the same
    n, _ = decide(sig(reporting=1, **HOT_QUEUE), PolicyState(up_since=T - 40), P, T)
    assert n > 4


def test_state_round_trips_through_a_plain_dict():
    st = PolicyState(up_since=1.0, down_since=None, last_change=3.0, last_target=4, queue_ref=2.0,
                     queue_ref_t=5.0, queue_rate=-0.5, reason="hold")
    d = {**st.to_dict(), "__decision_counters": 3, "other": 1}  # Serve's own keys live in the same dict
    assert PolicyState.from_dict(d) == st
    assert PolicyState.from_dict(None) == PolicyState()
    assert all(isinstance(v, (int, float, str, type(None))) for v in st.to_dict().values())


@pytest.mark.parametrize("bad", [dict(occ_down=0.8), dict(queue_down=5), dict(squeeze_down=0.5),
                                 dict(kv_down=0.95), dict(upscale_delay_s=-1), dict(max_up_factor=0.5),
                                 dict(min_replicas=5, max_replicas=2), dict(trend_s=0)])
def test_params_validated(bad):
    with pytest.raises(ValueError):
        PolicyParams(**bad)


# ----- the Serve adapter -----------------------------------------------------------------------------------------

pytest.importorskip("ray.serve.config")
from ray.serve._private.common import DeploymentID, ReplicaID  # noqa: E402
from ray.serve.config import AutoscalingConfig, AutoscalingContext, AutoscalingPolicy  # noqa: E402

DEP = DeploymentID(name="LLMServer", app_name="dspark")


def replica_ids(n: int) -> list[ReplicaID]:
    return [ReplicaID(unique_id=f"r{i}", deployment_id=DEP) for i in range(n)]


def make_ctx(replicas, metrics, now, state=None, target=None, config=None, lo=1, hi=16, lazy=False):
    return AutoscalingContext(
        deployment_id=DEP, deployment_name=DEP.name, app_name=DEP.app_name, current_num_replicas=len(replicas),
        target_num_replicas=len(replicas) if target is None else target, running_replicas=replicas,
        total_num_requests=0.0, total_queued_requests=0.0,
        aggregated_metrics=(lambda: metrics) if lazy else metrics, raw_metrics={},
        capacity_adjusted_min_replicas=lo, capacity_adjusted_max_replicas=hi, policy_state=dict(state or {}),
        last_scale_up_time=None, last_scale_down_time=None, current_time=now,
        config=config or AutoscalingConfig(min_replicas=lo, max_replicas=hi, upscale_delay_s=0, downscale_delay_s=0))


def per_replica(replicas, **values):
    return {name: {r: v for r in replicas} for name, v in values.items()}


def test_signals_from_metrics_means_and_missing():
    reps = replica_ids(3)
    m = {"queue_depth": {reps[0]: 10.0, reps[1]: 2.0}, "seq_occupancy": {reps[0]: 0.9, reps[1]: float("nan")},
         "unrelated": {reps[2]: 5.0}, "running": {ReplicaID("gone", DEP): 100.0}}
    s = signals_from_metrics(m, reps, ready=3, target=4, min_replicas=1, max_replicas=8)
    assert s.reporting == 2  # r2 reports nothing we read; a replica no longer running is ignored
    assert s.queue_depth == 6.0 and s.seq_occupancy == 0.9 and s.running == 0.0
    assert (s.ready, s.target, s.min_replicas, s.max_replicas) == (3, 4, 1, 8)


@pytest.mark.parametrize("lazy", [False, True])
def test_dspark_policy_scales_up_after_delay_with_state_in_ctx(lazy):
    reps = replica_ids(2)
    metrics = per_replica(reps, queue_depth=30.0, running=256.0, seq_occupancy=1.0, token_occupancy=0.95,
                          kv_usage=0.5, verify_tokens_per_step=0.0, verify_tokens_per_seq=0.0, spec_squeezed=0.8)
    state, t, n = {}, 5000.0, 2
    while n == 2 and t < 5100:
        n, state = dspark_policy(make_ctx(reps, metrics, t, state, lazy=lazy))
        assert isinstance(n, int) and isinstance(state, dict)
        t += 1.0
    assert n == 4 and state["dspark_reason"].startswith("up:")
    assert t - 5000.0 >= PolicyParams().upscale_delay_s


def test_dspark_policy_without_metrics_holds():
    reps = replica_ids(3)
    n, state = dspark_policy(make_ctx(reps, {}, 100.0))
    assert n == 3 and state["dspark_reason"] == "no metrics"
    ctx = make_ctx(reps, None, 100.0)
    assert dspark_policy(ctx)[0] == 3


def test_class_policy_takes_kwargs():
    pol = DSparkPolicy(upscale_delay_s=0, up_cooldown_s=0, token_budget=4096)
    assert pol.params.token_budget == 4096
    reps = replica_ids(2)
    metrics = per_replica(reps, queue_depth=30.0, running=256.0, seq_occupancy=1.0)
    n, _ = pol(make_ctx(reps, metrics, 10.0))
    assert n == 4
    with pytest.raises(TypeError):
        DSparkPolicy(no_such_knob=1)


def test_through_serve_wrapper_with_yaml_config():
    """The exact wiring for configs/serve.yaml, through Serve's own policy resolution and wrapper (scaling
    factors, its delay logic, bounds), with our state kept next to Serve's keys."""
    from ray.serve._private.autoscaling_state import _resolve_policy_callable
    from ray.serve.autoscaling_policy import _apply_autoscaling_config

    yaml_dict = {"min_replicas": 1, "max_replicas": 5, "upscale_delay_s": 0, "downscale_delay_s": 0,
                 "policy": {"policy_function": "autoscale.policy:DSparkPolicy",
                            "policy_kwargs": {"upscale_delay_s": 10, "token_budget": 2048}}}
    cfg = AutoscalingConfig(**yaml_dict)
    policy = _apply_autoscaling_config(_resolve_policy_callable(cfg.policy))
    reps = replica_ids(2)
    hot = per_replica(reps, queue_depth=30.0, running=256.0, seq_occupancy=1.0)
    state, decisions, n = {}, [], 2
    for i in range(15):  # the two new replicas stay starting: no further scale-up meanwhile
        n, state = policy(make_ctx(reps, hot, 100.0 + i, state, target=n, config=cfg, hi=5))
        decisions.append(n)
    assert decisions == [2] * 10 + [4] * 5
    assert "__decision_counters" in state and state["dspark_last_target"] == 4

    plain = AutoscalingConfig(policy=AutoscalingPolicy(policy_function="autoscale.policy:dspark_policy"))
    assert _resolve_policy_callable(plain.policy) is not None


def test_policy_pickles_by_value_for_the_controller():
    """Serve cloudpickles the policy module by value; the controller must be able to run it without importing
    the project (it only needs ray)."""
    cfg = AutoscalingConfig(policy={"policy_function": "autoscale.policy:DSparkPolicy",
                                    "policy_kwargs": {"upscale_delay_s": 0, "up_cooldown_s": 0}})
    blob = cfg.policy.get_serialized_policy_def()
    code = (
        "import sys, pickle; sys.modules['autoscale'] = None; sys.modules['engine'] = None\n"
        "from ray import cloudpickle\n"
        "cls = cloudpickle.loads(sys.stdin.buffer.read())\n"
        "pol = cls(upscale_delay_s=0, up_cooldown_s=0)\n"
        "class C: pass\n"
        "cfg = C(); cfg.upscale_delay_s = 30.0; cfg.downscale_delay_s = 600.0  # stacked delays: a warning\n"
        "ctx = C(); ctx.config = cfg; ctx.aggregated_metrics = {'queue_depth': {'a': 50.0}, 'running': {'a': 256.0},"
        " 'seq_occupancy': {'a': 1.0}}\n"
        "ctx.running_replicas = ['a']; ctx.current_num_replicas = 1; ctx.target_num_replicas = 1\n"
        "ctx.capacity_adjusted_min_replicas = 1; ctx.capacity_adjusted_max_replicas = 4; ctx.policy_state = {}\n"
        "ctx.current_time = 1.0\n"
        "print(pol(ctx)[0]); print(pol(ctx)[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert out.stdout.decode().split() == ["2", "2"]
    assert out.stderr.decode().count("add to the policy's own delays") == 1


def test_metric_names_are_the_agreed_ones():
    assert METRICS == ("queue_depth", "running", "seq_occupancy", "token_occupancy", "kv_usage",
                       "verify_tokens_per_step", "verify_tokens_per_seq", "spec_squeezed")
