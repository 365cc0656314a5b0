"""A Ray Serve autoscaling policy for dspark replicas, driven by the engine's own load signals.

Serve's default policy scales on ongoing requests per replica, which says little about an LLM replica: one replica
holds hundreds of sequences, and what limits it is the engine's admission (sequence slots, the token budget, KV
blocks). The replicas publish those through `record_autoscaling_stats()` (names in METRICS) and this policy reads
them:

- scale up when requests queue for admission (mean waiting per replica above `queue_up`, and not draining on its
  own within `drain_horizon_s`), when KV is nearly full, or when the replicas are so full that the verify-length
  controller squeezes speculation out (a share `squeeze_up` of steps verify nothing while occupancy is at least
  `occ_up`): from there on every added sequence slows all the others' decoding, and queues follow. The condition
  must hold for `upscale_delay_s`; the new size is what the measured demand needs at `target_occupancy` (at most
  `max_up_factor` times the current size), and no further scale-up happens while the new replicas start;
- scale down one replica at a time once the fleet has been idle for `downscale_delay_s`, where idle means the
  load would still fit under `occ_down` with one replica fewer;
- never flap: the up and down conditions are far apart (`occ_down` < `target_occupancy` < `occ_up`), each needs its
  condition to hold continuously, and every change starts a cooldown, counted from when the new replicas serve,
  longer than Serve's metrics look-back.

`decide` is a pure function over plain numbers (dataclasses), used unchanged by the fleet simulator
(autoscale/simulator.py); `dspark_policy` / `DSparkPolicy` adapt it to Serve's AutoscalingContext.

Wiring (Serve config YAML, per deployment)::

    autoscaling_config:
      min_replicas: 1
      max_replicas: 64
      upscale_delay_s: 0      # the delays live in this policy; Serve's own would stack on top of them
      downscale_delay_s: 0
      policy:
        policy_function: autoscale.policy:DSparkPolicy   # or autoscale.policy:dspark_policy (defaults only)
        policy_kwargs: {token_budget: 2048, max_num_seqs: 256}   # the engine's limits; any PolicyParams field

Ray 2.60 passes `policy_kwargs` only to a class (it instantiates it once and calls it every control-loop tick);
a plain function gets none, so `dspark_policy` always runs with the defaults. Serve wraps either one with its
own scaling factors, delays and min/max bounds: leave the factors at 1 and the delays at 0.

This module imports only the standard library: Serve pickles it by value into its controller, which need not be
able to import the project.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping, Sequence

log = logging.getLogger("ray.serve")

# What every replica's `record_autoscaling_stats()` returns (agreed with deployments/).
METRICS = ("queue_depth", "running", "seq_occupancy", "token_occupancy", "kv_usage", "verify_tokens_per_step",
           "verify_tokens_per_seq", "spec_squeezed")
STATE_PREFIX = "dspark_"  # our keys in ctx.policy_state (Serve keeps its own "__decision_*" keys there too)


@dataclass(frozen=True)
class LoadSignals:
    """The fleet's load as the policy sees it: means over the replicas that reported, plus replica counts."""

    ready: int  # replicas serving (Serve: current_num_replicas)
    target: int  # the current target, replicas still starting included
    reporting: int  # replicas whose metrics arrived
    min_replicas: int = 1
    max_replicas: int = 1_000_000
    queue_depth: float = 0.0  # requests waiting for admission
    running: float = 0.0  # running sequences
    seq_occupancy: float = 0.0  # running / max_num_seqs
    token_occupancy: float = 0.0  # tokens per step / token budget (verify tokens included)
    kv_usage: float = 0.0
    verify_tokens_per_step: float = 0.0
    verify_tokens_per_seq: float = 0.0
    spec_squeezed: float = 0.0  # share of recent steps where load left speculation nothing to verify


@dataclass(frozen=True)
class PolicyParams:
    """Thresholds on the replica means (occupancy: see `load`). The defaults come from the fleet simulator with its
    assumed profile (bench/autoscale_sim.py): there a replica's occupancy rises steeply near its capacity, and
    speculation starts being squeezed out somewhat before it. So: scale up when speculation is being squeezed out at
    a high occupancy, to target_occupancy (a fleet with headroom: occupancy is not linear in load), and scale down
    when one replica fewer would stay well under it. Re-tune with measured profiles
    (bench/autoscale_sim.py --profile)."""

    # Scale up when one of these holds for upscale_delay_s.
    queue_up: float = 4.0  # mean requests waiting per replica (unless the queue drains within drain_horizon_s)
    squeeze_up: float = 0.12  # spec_squeezed at or above this ...
    occ_up: float = 0.50  # ... while occupancy is at or above this
    kv_up: float = 0.90
    upscale_delay_s: float = 30.0
    target_occupancy: float = 0.45  # a scale-up sizes the fleet so the demand fills replicas to this
    max_up_factor: float = 2.0  # at most this many times the current target per decision
    # A queue that empties within this horizon needs no new replica: one would arrive about when it is empty
    # anyway. Keep it above the replicas' start-up time. The trend is measured over trend_s.
    drain_horizon_s: float = 180.0
    trend_s: float = 20.0
    # Scale down by one when all of these hold for downscale_delay_s (occupancy and KV with one replica fewer).
    queue_down: float = 0.5
    occ_down: float = 0.30
    kv_down: float = 0.60
    squeeze_down: float = 0.05
    downscale_delay_s: float = 300.0
    # After any change: longer than Serve's look_back_period_s (30 s), so decisions see the new fleet's metrics.
    up_cooldown_s: float = 60.0
    down_cooldown_s: float = 60.0
    # While replicas start, no further scale-up (they are already sized for the demand; the cooldowns only start
    # once they serve), unless they have not come up after this long (e.g. no GPU node could be had).
    start_timeout_s: float = 600.0
    min_replicas: int = 1  # on top of Serve's (capacity-adjusted) min/max_replicas
    max_replicas: int = 1_000_000
    # Engine limits, when known. max_num_seqs None: inferred as running / seq_occupancy. token_budget (the engine's
    # max_num_batched_tokens) lets the policy discount verify tokens, which the controller adds only when there is
    # room, from token occupancy; None: token occupancy is taken as it is (scale-down is then more cautious).
    max_num_seqs: int | None = None
    token_budget: int | None = None

    def __post_init__(self) -> None:
        if not (0 <= self.occ_down < self.target_occupancy < self.occ_up <= 1.5):
            raise ValueError("need 0 <= occ_down < target_occupancy < occ_up")
        if not 0 <= self.queue_down < self.queue_up:
            raise ValueError("need 0 <= queue_down < queue_up")
        if not 0 <= self.squeeze_down < self.squeeze_up:
            raise ValueError("need 0 <= squeeze_down < squeeze_up")
        if not 0 <= self.kv_down < self.kv_up:
            raise ValueError("need 0 <= kv_down < kv_up")
        times = (self.upscale_delay_s, self.downscale_delay_s, self.up_cooldown_s, self.down_cooldown_s,
                 self.drain_horizon_s, self.start_timeout_s)
        if min(times) < 0 or self.trend_s <= 0:
            raise ValueError("delays, cooldowns and horizons must be >= 0 (trend_s > 0)")
        if self.max_up_factor < 1 or self.min_replicas < 0 or self.max_replicas < max(1, self.min_replicas):
            raise ValueError("need max_up_factor >= 1 and 0 <= min_replicas <= max_replicas")


@dataclass(frozen=True)
class PolicyState:
    """What the policy remembers between calls (Serve persists it in ctx.policy_state). Plain numbers only."""

    up_since: float | None = None  # since when the scale-up condition has held
    down_since: float | None = None  # since when the fleet has been idle
    last_change: float | None = None  # when the target last changed
    last_starting: float | None = None  # when replicas were last seen starting (target above serving)
    last_target: int | None = None  # the target this policy returned last
    queue_ref: float | None = None  # queue depth at queue_ref_t, the start of the current trend interval
    queue_ref_t: float | None = None
    queue_rate: float = 0.0  # queue depth change per second over the last trend interval
    reason: str = ""  # why, for logs and tests

    def to_dict(self) -> dict[str, Any]:
        return {STATE_PREFIX + k: v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "PolicyState":
        d = d or {}
        return cls(**{f.name: d[STATE_PREFIX + f.name] for f in fields(cls) if STATE_PREFIX + f.name in d})


def load(s: LoadSignals, p: PolicyParams) -> float:
    """Occupancy as the larger of sequence slots and token budget in use; verify tokens are not load (the
    controller only adds them where the budget has room), so they are discounted when the budget is known."""
    tokens = s.token_occupancy
    if p.token_budget:
        tokens = max(0.0, tokens - s.verify_tokens_per_step / p.token_budget)
    return max(s.seq_occupancy, tokens)


def wanted_replicas(s: LoadSignals, p: PolicyParams) -> int:
    """Replicas that would carry the measured demand (running + queued sequences, and the token load) at
    target_occupancy. The demand is per-replica means times the serving replicas: replicas that have not reported
    yet are assumed to carry the mean; replicas still starting carry nothing yet."""
    need = load(s, p) * s.ready / p.target_occupancy
    cap = p.max_num_seqs or (s.running / s.seq_occupancy if s.seq_occupancy > 0.01 else 0.0)
    if cap > 0:
        need = max(need, (s.running + s.queue_depth) * s.ready / (cap * p.target_occupancy))
    return math.ceil(need - 1e-9)


def decide(s: LoadSignals, state: PolicyState, p: PolicyParams, now: float) -> tuple[int, PolicyState]:
    """The new target number of replicas, and the state to pass to the next call."""
    lo = max(s.min_replicas, p.min_replicas)
    hi = max(lo, min(s.max_replicas, p.max_replicas))
    cur = s.target
    st = state
    if st.last_target is not None and st.last_target != cur:
        st = replace(st, last_change=now)  # someone else moved the target (bounds, redeploy, target_capacity)

    def done(n: int, reason: str, **kw) -> tuple[int, PolicyState]:
        n = min(hi, max(lo, n))
        return n, replace(st, last_target=n, reason=reason, last_change=now if n != cur else st.last_change, **kw)

    if not lo <= cur <= hi:
        return done(cur, "bounds", up_since=None, down_since=None)
    if s.reporting == 0:  # nothing to judge by (all replicas new, or metrics lost): hold and start over
        return done(cur, "no metrics", up_since=None, down_since=None, queue_ref=None, queue_ref_t=None)

    # Queue trend, over intervals of trend_s (Serve calls the policy every 0.1 s; metrics move every few s).
    if st.queue_ref_t is None or now < st.queue_ref_t:
        st = replace(st, queue_ref=s.queue_depth, queue_ref_t=now, queue_rate=0.0)
    elif now - st.queue_ref_t >= p.trend_s:
        rate = (s.queue_depth - st.queue_ref) / (now - st.queue_ref_t)
        st = replace(st, queue_ref=s.queue_depth, queue_ref_t=now, queue_rate=rate)
    draining = st.queue_rate < 0 and s.queue_depth <= -st.queue_rate * p.drain_horizon_s

    occ = load(s, p)
    hot = [name for name, cond in (("queue", s.queue_depth > p.queue_up and not draining),
                                   ("squeeze", s.spec_squeezed >= p.squeeze_up and occ >= p.occ_up),
                                   ("kv", s.kv_usage >= p.kv_up)) if cond]
    up_since = (st.up_since if st.up_since is not None else now) if hot else None
    # Idle: the same load spread over one replica fewer still sits well below every up threshold (to zero
    # replicas: no load at all).
    keep = min(cur, s.ready) - 1
    if keep >= 1:
        fits = occ * s.ready / keep <= p.occ_down and s.kv_usage * s.ready / keep <= p.kv_down
    else:
        fits = s.running == 0 and s.queue_depth == 0
    idle = not hot and fits and s.queue_depth <= p.queue_down and s.spec_squeezed <= p.squeeze_down
    down_since = (st.down_since if st.down_since is not None else now) if idle else None
    starting = cur > s.ready
    if starting:
        st = replace(st, last_starting=now)
    # Cooldowns run from the last change or, if later, from when its replicas were all up: until then the
    # metrics describe the old fleet.
    quiet = now - max(st.last_change if st.last_change is not None else -math.inf,
                      st.last_starting if st.last_starting is not None else -math.inf)
    stuck = starting and st.last_change is not None and now - st.last_change >= p.start_timeout_s

    if hot and now - up_since >= p.upscale_delay_s and (quiet >= p.up_cooldown_s or stuck):
        n = max(cur + 1, wanted_replicas(s, p))
        n = min(n, max(cur + 1, math.ceil(cur * p.max_up_factor)), hi)
        if n > cur:
            return done(n, "up:" + "+".join(hot), up_since=None, down_since=None)
        return done(cur, "hold:max", up_since=up_since, down_since=None)
    if (idle and now - down_since >= p.downscale_delay_s and quiet >= p.down_cooldown_s and not starting
            and cur > lo):
        # One replica per step; idleness carries over, so the next step needs only the cooldown.
        return done(cur - 1, "down:idle", up_since=None, down_since=down_since)
    return done(cur, "hold", up_since=up_since, down_since=down_since)


# ----- Serve adapter -------------------------------------------------------------------------------------------


def _mean(values) -> float | None:
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def signals_from_metrics(metrics: Mapping[str, Mapping[Any, float]], replicas: Sequence, ready: int, target: int,
                         min_replicas: int, max_replicas: int) -> LoadSignals:
    """Per-replica metrics (name -> replica -> value, as Serve aggregates them) -> LoadSignals. Only `replicas`
    count; a replica that reports none of METRICS yet (just started) is left out of the means."""
    replicas = list(replicas)
    per_name = {name: [metrics.get(name, {}).get(r) for r in replicas] for name in METRICS}
    reporting = sum(1 for i in range(len(replicas)) if any(per_name[n][i] is not None for n in METRICS))
    means = {name: _mean(vals) for name, vals in per_name.items()}
    return LoadSignals(ready=ready, target=target, reporting=reporting, min_replicas=min_replicas,
                       max_replicas=max_replicas, **{k: v for k, v in means.items() if v is not None})


_warned_delays = False


def _run(ctx, params: PolicyParams) -> tuple[int, dict[str, Any]]:
    global _warned_delays
    cfg = ctx.config
    if not _warned_delays and cfg is not None and (cfg.upscale_delay_s or cfg.downscale_delay_s):
        _warned_delays = True
        log.warning("dspark policy: Serve's upscale_delay_s/downscale_delay_s (%s/%s) add to the policy's own "
                    "delays; set both to 0 in autoscaling_config", cfg.upscale_delay_s, cfg.downscale_delay_s)
    signals = signals_from_metrics(ctx.aggregated_metrics or {}, ctx.running_replicas or [],
                                   ready=ctx.current_num_replicas, target=ctx.target_num_replicas,
                                   min_replicas=ctx.capacity_adjusted_min_replicas,
                                   max_replicas=ctx.capacity_adjusted_max_replicas)
    now = ctx.current_time if ctx.current_time is not None else time.time()
    n, state = decide(signals, PolicyState.from_dict(ctx.policy_state), params, now)
    if n != ctx.target_num_replicas:
        log.info("dspark policy: %d -> %d replicas (%s); %s", ctx.target_num_replicas, n, state.reason, signals)
    return n, state.to_dict()


def dspark_policy(ctx) -> tuple[int, dict[str, Any]]:
    """Serve custom autoscaling policy with the default PolicyParams: `policy_function:
    autoscale.policy:dspark_policy`. Returns (target replicas, policy state)."""
    return _run(ctx, DEFAULT_PARAMS)


class DSparkPolicy:
    """The same policy with parameters: `policy_function: autoscale.policy:DSparkPolicy` and `policy_kwargs:
    {...}` (any PolicyParams field). Serve instantiates it once per deployment and calls it every tick."""

    def __init__(self, **policy_kwargs):
        self.params = PolicyParams(**policy_kwargs)  # unknown or inconsistent kwargs fail the deploy, loudly

    def __call__(self, ctx) -> tuple[int, dict[str, Any]]:
        return _run(ctx, self.params)


DEFAULT_PARAMS = PolicyParams()
