"""A fleet simulator: a request trace against N modelled dspark replicas, scaled by the autoscaling policy.

Each replica is modelled at engine-step granularity, with the engine's own rules and the controller's own code:
- scheduling as engine/scheduler.py: running sequences first (one decode token each, then the running prompts'
  chunks), then waiting prompts FCFS while sequence slots, the token budget and KV room allow (prefill chunks count
  as tokens);
- speculation as engine/speculator.py: the decoding sequences draft when the replica's `DraftGate` says so (scored
  by each drafted step's goodput against a plain step), and `choose_verify_lengths` sets every sequence's verify
  length;
- each decoding sequence emits 1 + its accepted drafts, drawn from the per-position acceptance rates;
- the step takes `StepCostModel.step_seconds(tokens, drafted)`: the measured (or assumed) forward and draft curves.
The fleet routes arrivals by power of two choices (Serve's default router), runs `autoscale.policy.decide` every
control interval on the replicas' metrics (means over Serve's look-back window), and starts replicas after a
start-up delay.

What keeps a day at thousands of requests/s affordable, and what it costs in fidelity:
- sequences are aggregated: a replica's decoding sequences share one progress clock (tokens emitted per sequence,
  the step's mean over the per-sequence draws; for 32 sequences or more, drawn from its normal approximation) and a
  heap of finish points, so a step costs O(1) Python. Per-request luck (a sequence that accepts more than the
  batch's mean) is restored by drawing each request's finish point with the variance the per-step draws imply.
  A pure-decode batch with nothing to admit and nothing finishing repeats itself: those steps are taken at once;
- the simulated drafter is calibrated and uniform: every sequence's confidences equal the acceptance rates, so the
  controller sees identical candidates and its decision depends only on (decoding sequences, step tokens). It is
  memoised on those, the tokens rounded to `controller_quantum` (32: the decision moves by about one verify token
  per token of load). The tracker's per-sequence correction (1 on average here) is not applied. A run of k
  identical drafted steps is scored by the gate once, with their mean;
- at most `max_simulated` replicas are simulated one by one; beyond that the simulated replicas stand for the whole
  fleet (mean field): they receive their share of the traffic (simulated / serving replicas), the policy reads
  their metrics as the fleet's means, and GPU-hours come from the full replica count. With the router keeping
  replicas evenly loaded this is close; it misses a new replica's first minutes of imbalance;
- not modelled: preemption (KV capacity is checked at admission only), draft-service failures, requests' own
  length caps on verify lengths, and the router's max_ongoing_requests (the engine queue is the only queue).
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from autoscale.policy import LoadSignals, PolicyParams, PolicyState, decide, signals_from_metrics
from autoscale.trace import Trace
from engine.acceptance import survival
from engine.draft_gate import DraftGate
from engine.spec_mode import parse_speculation
from engine.step_cost import Curve, StepCostModel
from engine.verify_length import Candidate, choose_verify_lengths

# ASSUMED, not measured: an H100 serving a ~4B model in bf16 (forward ~12 ms at 1 token, ~35 ms at 512, then
# compute-bound), a DSpark draft round of 2-4 ms, and a drafter accepting 0.8 .. 0.45 per position (conditional on
# the earlier positions). bench/autoscale_sim.py --profile swaps in measured numbers.
ASSUMED_PROFILE = {
    "source": "assumed: H100, ~4B model, bf16 (not measured)",
    "forward_grid": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048],
    "forward_ms": [12.0, 12.1, 12.2, 12.4, 12.8, 13.6, 15.2, 18.5, 25.0, 35.0, 60.0, 110.0],
    "draft_grid": [1, 16, 64, 256],
    "draft_ms": [2.0, 2.4, 3.0, 4.0],
    "acceptance": [0.8, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45],
}


@dataclass(frozen=True)
class ReplicaSpec:
    """One replica: its hardware profile (step-cost curves, acceptance) and its engine limits."""

    forward_grid: tuple[int, ...] = tuple(ASSUMED_PROFILE["forward_grid"])
    forward_ms: tuple[float, ...] = tuple(ASSUMED_PROFILE["forward_ms"])
    draft_grid: tuple[int, ...] = tuple(ASSUMED_PROFILE["draft_grid"])
    draft_ms: tuple[float, ...] = tuple(ASSUMED_PROFILE["draft_ms"])
    acceptance: tuple[float, ...] = tuple(ASSUMED_PROFILE["acceptance"])  # per position, conditional
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    kv_capacity_tokens: int = 400_000
    max_waiting: int = 4096  # the engine refuses more (HTTP 429)
    speculation: str = "adaptive"

    @classmethod
    def from_profile(cls, profile: dict, **overrides) -> "ReplicaSpec":
        keys = ("forward_grid", "forward_ms", "draft_grid", "draft_ms", "acceptance")
        return cls(**{k: tuple(profile[k]) for k in keys if k in profile}, **overrides)

    def cost_model(self) -> StepCostModel:
        return StepCostModel(Curve(list(self.forward_grid), [ms / 1000 for ms in self.forward_ms]),
                             Curve(list(self.draft_grid), [ms / 1000 for ms in self.draft_ms]))


@dataclass(frozen=True)
class FleetSpec:
    startup_s: float = 120.0  # replica start: node, model load, warm-up (assumed)
    control_interval_s: float = 5.0  # how often the policy runs
    look_back_s: float = 30.0  # Serve's look_back_period_s: the policy sees means over this window
    route_dt_s: float = 0.1  # the router sees replica queue lengths at most this old
    drain_timeout_s: float = 60.0  # a stopping replica finishes its requests, then is killed
    max_simulated: int = 4  # replicas simulated one by one; the rest are mean-field copies
    stats_window_s: float = 900.0  # latency percentiles per window of this length
    controller_quantum: int = 32  # step tokens are rounded to this for the memoised controller (1: exact)


# ----- what all replicas of a fleet share ----------------------------------------------------------------------

LAT_BINS = np.logspace(-4, 3, 701)  # seconds, ~2.3% per bin
CLT_MIN = 32  # batches of at least this many decoding sequences draw their mean acceptance, not each sequence's
_MEMOS: dict[tuple, dict] = {}  # controller decisions, shared by every fleet with the same replica and quantum


class _Shared:
    """The cost model, the memoised controller, and pools of random draws, shared by a fleet's replicas."""

    def __init__(self, spec: ReplicaSpec, quantum: int, rng: np.random.Generator):
        self.spec, self.quantum, self.rng = spec, quantum, rng
        self.cost = spec.cost_model()
        self.conf = list(spec.acceptance)  # a calibrated drafter: confidence = acceptance
        self.gamma = len(self.conf)
        self.mode = parse_speculation(spec.speculation)
        self.spec_on = self.mode.kind != "off"
        self.adaptive = self.mode.kind == "adaptive"
        self.survival = np.array(survival(self.conf))
        self.memo = _MEMOS.setdefault((spec.forward_grid, spec.forward_ms, spec.draft_grid, spec.draft_ms,
                                       spec.acceptance, spec.max_num_batched_tokens, spec.speculation, quantum), {})
        # Tokens a sequence emits per step at verify length L: mean and sd of 1 + min(G, L).
        p_ge = np.concatenate([[1.0], self.survival])  # P(G >= j), j = 0..gamma
        p_eq = p_ge - np.append(p_ge[1:], 0.0)
        self.emit_mean, self.emit_sd = [], []
        for L in range(self.gamma + 1):
            x = 1 + np.minimum(np.arange(self.gamma + 1), L)
            m = float((p_eq * x).sum())
            self.emit_mean.append(m)
            self.emit_sd.append(float(np.sqrt((p_eq * (x - m) ** 2).sum())))
        self._g, self._gi = np.empty(0, np.int8), 0
        self._z, self._zi = np.empty(0), 0
        self._dt: dict[tuple[int, int], float] = {}
        self._moments: dict[int, tuple[float, float]] = {}

    def step_seconds(self, tokens: int, drafted: int) -> float:
        key = (tokens, drafted)
        dt = self._dt.get(key)
        if dt is None:
            dt = self._dt[key] = self.cost.step_seconds(tokens, drafted)
        return dt

    def lengths(self, n_dec: int, tokens: int) -> tuple[np.ndarray, int]:
        """Every decoding sequence's verify length, as choose_verify_lengths decides it, and their sum. The step's
        tokens are rounded to `quantum` (the decision moves by about one verify token per token of load, and an
        exact key would call the controller, O(n log n) in Python, on most busy steps)."""
        q = self.quantum
        key = (n_dec, max(n_dec, (tokens + q // 2) // q * q))
        got = self.memo.get(key)
        if got is None:
            cands = [Candidate(i, self.conf, self.mode, self.gamma) for i in range(n_dec)]
            lens = choose_verify_lengths(cands, key[1], n_dec, self.cost, self.spec.max_num_batched_tokens)
            arr = np.fromiter((lens[i] for i in range(n_dec)), np.int8, n_dec)
            got = self.memo[key] = (arr, int(arr.sum()))
        return got

    def accepted_drafts(self, n: int) -> np.ndarray:
        """n draws of G, the leading drafts a sequence would accept (P(G >= j) = survival_j)."""
        if self._gi + n > len(self._g):
            u = self.rng.random(max(1 << 20, n))
            self._g = (u[:, None] < self.survival[None, :]).sum(1).astype(np.int8)
            self._gi = 0
        out = self._g[self._gi:self._gi + n]
        self._gi += n
        return out

    def emitted(self, lens: np.ndarray, k: int) -> np.ndarray | list[float]:
        """Over k steps at these verify lengths: the tokens a decoding sequence emits per step on average over the
        batch (1 + accepted drafts). Batches of CLT_MIN sequences or more draw the batch mean from its normal
        approximation (one draw per step, not one per sequence)."""
        n = len(lens)
        if n < CLT_MIN:
            acc = np.minimum(self.accepted_drafts(k * n).reshape(k, n), lens)
            return 1.0 + acc.sum(axis=1) / n
        mean, sd = self._batch_moments(lens)
        return [mean + sd * self.normal() for _ in range(k)]

    def _batch_moments(self, lens: np.ndarray) -> tuple[float, float]:
        key = id(lens)  # lens arrays live in the memo, one per decision
        got = self._moments.get(key)
        if got is None:
            counts = np.bincount(lens, minlength=self.gamma + 1)
            n = len(lens)
            mean = float(np.dot(counts, self.emit_mean)) / n
            sd = float(np.sqrt(np.dot(counts, np.square(self.emit_sd)))) / n
            got = self._moments[key] = (mean, sd)
        return got

    def normal(self) -> float:
        if self._zi >= len(self._z):
            self._z, self._zi = self.rng.standard_normal(1 << 16), 0
        self._zi += 1
        return float(self._z[self._zi - 1])


# ----- one replica ---------------------------------------------------------------------------------------------


class Replica:
    """One engine, stepped from its own clock. Requests: waiting (arrival, prompt, output); prefilling [left,
    arrival, prompt, output]; decoding: a heap of (finish progress, n, arrival, first-token time, prompt, p0,
    output)."""

    def __init__(self, shared: _Shared, ready_at: float, name: str):
        self.sh, self.name = shared, name
        self.clock = ready_at
        self.waiting: deque = deque()
        self.prefill: list = []
        self.heap: list = []
        self.progress = 0.0  # tokens each decoding sequence has emitted (the batch mean), since start
        self.kv_prompt = 0  # prompt tokens of running sequences
        self.sum_p0 = 0.0  # sum of the progress at which each decoding sequence started
        self.seq_no = 0
        self.steps = 0
        self.gate = DraftGate()
        self.done: list = []  # (finish time, ttft, tpot, e2e) since the fleet last collected
        self.windows: deque = deque()  # metrics per control interval, newest last
        self.w = [0.0] * 10  # this interval's sums, see close_window

    @property
    def running(self) -> int:
        return len(self.heap) + len(self.prefill)

    @property
    def ongoing(self) -> int:
        return len(self.waiting) + self.running

    def kv_tokens(self) -> float:
        return self.kv_prompt + len(self.heap) * self.progress - self.sum_p0

    def queued(self) -> int:
        """Requests waiting for admission: the router hands a replica its requests up to a slice early, and those
        that have not arrived yet do not count."""
        w, j = self.waiting, len(self.waiting)
        while j and w[j - 1][0] > self.clock:
            j -= 1
        return j

    def run_until(self, t_stop: float) -> None:
        while self.clock < t_stop:
            if not self._step(t_stop):
                # Nothing to run: sleep until the next arrival (requests routed ahead of their time wait too).
                wake = t_stop
                if self.waiting and self.waiting[0][0] < t_stop:
                    wake = max(self.waiting[0][0], self.clock)
                    if wake == self.clock:  # arrived but cannot ever be admitted (prompt beyond the KV cache)
                        self.waiting.popleft()
                        continue
                w = self.w
                w[0] += wake - self.clock
                w[1] += self.queued() * (wake - self.clock)
                self.clock = wake

    def _step(self, t_stop: float) -> bool:
        """One engine step, or k identical ones when the batch cannot change before the k-th (pure decode, nothing
        to admit, no sequence finishing): then the draws of all k are made at once. False: nothing to run."""
        sh, spec = self.sh, self.sh.spec
        budget = spec.max_num_batched_tokens
        heap = self.heap
        n_dec = len(heap)
        left = budget - n_dec
        chunks = []
        for e in self.prefill:  # running prompts continue, in arrival order
            if left <= 0:
                break
            c = e[0] if e[0] < left else left
            chunks.append((e, c))
            left -= c
        running = n_dec + len(self.prefill)
        w = self.waiting
        kv = self.kv_prompt + n_dec * self.progress - self.sum_p0
        while w and left > 0 and running < spec.max_num_seqs and w[0][0] <= self.clock:
            arrival, prompt, out = w[0]
            if kv + prompt > spec.kv_capacity_tokens:
                break
            w.popleft()
            e = [prompt, arrival, prompt, out]
            self.prefill.append(e)
            self.kv_prompt += prompt
            kv += prompt
            running += 1
            c = prompt if prompt < left else left
            chunks.append((e, c))
            left -= c
        tokens = budget - left
        if tokens == 0:
            return False

        # Speculation, as Speculator.prepare: the gate, then the controller's verify lengths.
        verify = drafted = 0
        lens = None
        probe = False
        if n_dec and sh.spec_on:
            probe = sh.adaptive and not self.gate.is_open(n_dec)
            if not sh.adaptive or self.gate.should_draft(n_dec):
                drafted = n_dec
                lens, verify = sh.lengths(n_dec, tokens)
        dt = sh.step_seconds(tokens + verify, drafted)

        k = 1
        if n_dec and not chunks:
            horizon = t_stop
            if w and running < spec.max_num_seqs and w[0][0] < horizon:
                horizon = w[0][0]
            # Each step emits at least one token per sequence, so the first finish comes within this many steps.
            k = max(1, min(math.ceil((horizon - self.clock) / dt), math.ceil(heap[0][0] - self.progress)))
            if drafted and probe:
                k = 1  # a probe: the next step may skip
            elif sh.spec_on and not drafted:
                k = min(k, self.gate.steps_until_probe(n_dec))  # skips left before the next probe
        if n_dec:
            gain = sh.emitted(lens, k) if drafted else [1.0] * k
            if k == 1:
                self.progress += float(gain[0])
            else:
                cum = self.progress + np.cumsum(gain)
                k = min(k, int(np.searchsorted(cum, heap[0][0])) + 1)  # stop at the first finish
                self.progress = float(cum[k - 1])
                if not drafted and sh.spec_on:
                    self.gate.skip(n_dec, k - 1)  # the skipped steps after the first
            if sh.spec_on and not chunks:  # the engine scores pure decode steps only
                if not drafted:  # calibrates the plain side (the profile's prediction is the truth here)
                    self.gate.record_plain(n_dec, dt, dt)
                elif sh.adaptive:
                    self.gate.record(n_dec, n_dec * float(np.mean(gain[:k])), dt, sh.step_seconds(tokens, 0))
            t_end = self.clock + k * dt
            while heap and heap[0][0] <= self.progress:
                _, _, arrival, first, prompt, p0, out = heapq.heappop(heap)
                self.kv_prompt -= prompt
                self.sum_p0 -= p0
                self.done.append((t_end, first - arrival, (t_end - first) / (out - 1), t_end - arrival))
        else:
            t_end = self.clock + dt
        mean_len = verify / n_dec if n_dec else 0.0
        for e, c in chunks:
            e[0] -= c
            if e[0]:
                continue
            self.prefill.remove(e)
            _, arrival, prompt, out = e
            if out <= 1:  # the prefill's own token was the only one
                self.kv_prompt -= prompt
                self.done.append((t_end, t_end - arrival, math.nan, t_end - arrival))
                continue
            # Finish point: out - 1 more tokens at the batch's mean pace, give or take this request's own luck.
            L = min(sh.gamma, int(round(mean_len)))
            luck = sh.normal() * sh.emit_sd[L] * math.sqrt((out - 1) / sh.emit_mean[L])
            self.seq_no += 1
            heapq.heappush(heap, (self.progress + max(1.0, out - 1 + luck), self.seq_no, arrival, t_end, prompt,
                                  self.progress, out))
            self.sum_p0 += self.progress

        # This interval's sums: time, queue*dt, running*dt, tokens*dt, kv*dt, steps, verify tokens, steps that
        # could draft, squeezed steps, verify tokens per decoding sequence.
        span = t_end - self.clock
        m = self.w
        m[0] += span
        m[1] += self.queued() * span
        m[2] += running * span
        m[3] += (tokens + verify) * span
        m[4] += kv * span
        m[5] += k
        m[6] += verify * k
        if n_dec and sh.spec_on:
            m[7] += k
            m[8] += k if verify == 0 else 0
            m[9] += mean_len * k
        self.clock = t_end
        self.steps += k
        return True

    def close_window(self, max_windows: int) -> None:
        """End a control interval: its metrics join the look-back window Serve would average over."""
        w, spec = self.w, self.sh.spec
        if w[0] > 0:
            self.windows.append({
                "queue_depth": w[1] / w[0],
                "running": w[2] / w[0],
                "seq_occupancy": w[2] / w[0] / spec.max_num_seqs,
                "token_occupancy": w[3] / w[0] / spec.max_num_batched_tokens,
                "kv_usage": w[4] / w[0] / spec.kv_capacity_tokens,
                "verify_tokens_per_step": w[6] / w[5] if w[5] else 0.0,
                "verify_tokens_per_seq": w[9] / w[7] if w[7] else 0.0,
                "spec_squeezed": w[8] / w[7] if w[7] else 0.0,
            })
            while len(self.windows) > max_windows:
                self.windows.popleft()
        self.w = [0.0] * 10

    def metrics(self) -> dict[str, float] | None:
        """What record_autoscaling_stats would report, averaged over the look-back window (None: nothing yet)."""
        if not self.windows:
            return None
        return {k: sum(w[k] for w in self.windows) / len(self.windows) for k in self.windows[0]}


# ----- the fleet -----------------------------------------------------------------------------------------------


TIMELINE_SIGNALS = ("queue_depth", "running", "seq_occupancy", "token_occupancy", "kv_usage", "verify_tokens_per_step",
                    "verify_tokens_per_seq", "spec_squeezed")  # the policy's inputs, fleet means per tick


@dataclass
class SimResult:
    timeline: dict[str, list] = field(default_factory=dict)  # per control tick
    windows: list[dict] = field(default_factory=list)  # latency percentiles per stats window
    overall: dict = field(default_factory=dict)
    gpu_hours: float = 0.0
    completed: int = 0  # simulated requests (a share of the trace when the fleet is mean-field)
    rejected: int = 0
    aborted: int = 0
    represented_requests: float = 0.0  # requests of the whole fleet these stand for
    decisions: list[tuple] = field(default_factory=list)  # (time, from, to, reason)

    def to_json(self) -> dict:
        return asdict(self)


class _LatencyStats:
    def __init__(self, window_s: float):
        self.window_s = window_s
        self.hists: dict[int, np.ndarray] = {}  # window -> counts (ttft, tpot, e2e) x bins

    def add(self, records: list) -> None:
        if not records:
            return
        arr = np.array(records)
        idx = (arr[:, 0] // self.window_s).astype(int)
        for win in np.unique(idx):
            sel = arr[idx == win]
            h = self.hists.setdefault(int(win), np.zeros((3, len(LAT_BINS) - 1), np.int64))
            for k in range(3):
                vals = sel[:, k + 1]
                h[k] += np.histogram(vals[np.isfinite(vals)], LAT_BINS)[0]

    @staticmethod
    def percentile(counts: np.ndarray, q: float) -> float:
        total = counts.sum()
        if total == 0:
            return math.nan
        i = int(np.searchsorted(np.cumsum(counts), q * total))
        return float(math.sqrt(LAT_BINS[i] * LAT_BINS[i + 1]))  # the bin's geometric middle

    def summary(self, counts: np.ndarray) -> dict:
        out = {"requests": int(counts[0].sum())}
        for k, name in enumerate(("ttft", "tpot", "e2e")):
            for q in (0.5, 0.99):
                out[f"{name}_p{int(q * 100)}_s"] = self.percentile(counts[k], q)
        return out

    def report(self) -> tuple[list[dict], dict]:
        wins = [{"t": w * self.window_s, **self.summary(h)} for w, h in sorted(self.hists.items())]
        total = sum(self.hists.values()) if self.hists else np.zeros((3, len(LAT_BINS) - 1), np.int64)
        return wins, self.summary(total)


def simulate(trace: Trace, spec: ReplicaSpec = ReplicaSpec(), fleet: FleetSpec = FleetSpec(),
             policy: PolicyParams | None = PolicyParams(), replicas: int = 1, duration_s: float | None = None,
             seed: int = 0) -> SimResult:
    """Replay `trace` on a fleet that starts with `replicas` serving replicas. `policy` None: a fixed fleet.
    Requests still running at the end are left out of the latencies."""
    if replicas < 1 or (policy is not None and policy.min_replicas < 1):
        raise ValueError("the simulated fleet keeps at least one replica")
    rng = np.random.default_rng(seed)
    trace_rng, route_rng = (np.random.default_rng(s) for s in rng.integers(0, 2**63, 2))
    sh = _Shared(spec, fleet.controller_quantum, np.random.default_rng(rng.integers(0, 2**63)))
    duration = trace.duration_s if duration_s is None else duration_s
    look = max(1, round(fleet.look_back_s / fleet.control_interval_s))
    lo = policy.min_replicas if policy else replicas
    hi = policy.max_replicas if policy else replicas

    names = iter(f"r{i}" for i in range(10**9))
    sims = [Replica(sh, 0.0, next(names)) for _ in range(min(replicas, fleet.max_simulated))]
    ready = replicas  # serving replicas, simulated or mean-field
    starting: list[float] = []  # ready-at times of replicas starting
    draining: list[tuple[Replica, float]] = []
    state = PolicyState()
    stats = _LatencyStats(fleet.stats_window_s)
    res = SimResult(timeline={k: [] for k in ("t", "rate", "target", "ready", "allocated", *TIMELINE_SIGNALS)})
    gpu_s = 0.0
    t = 0.0
    dt_ctrl = fleet.control_interval_s
    while t < duration:
        # Replicas that finished starting begin serving; the first max_simulated are simulated one by one.
        for r_at in [x for x in starting if x <= t]:
            starting.remove(r_at)
            ready += 1
            if len(sims) < fleet.max_simulated:
                sims.append(Replica(sh, t, next(names)))
        share = len(sims) / ready
        times, prompts, outputs = trace.arrivals(t, t + dt_ctrl, share, trace_rng)
        res.represented_requests += len(times) / share
        _route_and_run(sims, draining, times, prompts, outputs, t, t + dt_ctrl, fleet, route_rng, res)
        for r in sims + [d for d, _ in draining]:
            stats.add(r.done)
            res.completed += len(r.done)
            r.done.clear()
        gpu_s += (ready + len(starting) + len(draining)) * dt_ctrl
        t += dt_ctrl
        for d in list(draining):  # a stopping replica goes once empty, or is killed after the graceful timeout
            r, since = d
            if r.ongoing and t - since >= fleet.drain_timeout_s:
                res.aborted += r.ongoing
            if not r.ongoing or t - since >= fleet.drain_timeout_s:
                draining.remove(d)

        for r in sims:
            r.close_window(look)
        per_replica = {r.name: r.metrics() for r in sims}
        reporting = [n for n, m in per_replica.items() if m is not None]
        by_metric: dict[str, dict] = {}
        for n in reporting:
            for k, v in per_replica[n].items():
                by_metric.setdefault(k, {})[n] = v
        signals = signals_from_metrics(by_metric, list(per_replica), ready=ready, target=ready + len(starting),
                                       min_replicas=lo, max_replicas=hi)
        if reporting and ready > len(sims):  # the mean-field replicas report like the simulated ones
            signals = replace(signals, reporting=len(reporting) + ready - len(sims))
        target = ready + len(starting)
        if policy is not None:
            new, state = decide(signals, state, policy, t)
            if new != target:
                res.decisions.append((t, target, new, state.reason))
                ready = _resize(new, target, ready, sims, starting, draining, t, fleet)
        _record_tick(res.timeline, t, trace, ready, starting, draining, signals)
    # Let the simulated replicas finish what they hold (latencies only; GPU time stops at the trace's end).
    for r in sims + [d for d, _ in draining]:
        r.run_until(duration + 600.0)
        stats.add(r.done)
        res.completed += len(r.done)
    res.windows, res.overall = stats.report()
    res.gpu_hours = gpu_s / 3600
    return res


def _route_and_run(sims, draining, times, prompts, outputs, t0, t1, fleet, rng, res) -> None:
    """Route each arrival of [t0, t1) by power of two choices on ongoing requests (as seen at the start of its
    routing slice, plus what this slice routed), and step every replica, draining ones too, through each slice."""
    n = len(sims)
    reqs = list(zip(times.tolist(), prompts.tolist(), outputs.tolist()))
    first = rng.integers(0, n, len(reqs)).tolist()
    other = ((np.array(first, dtype=np.int64) + 1 + rng.integers(0, max(1, n - 1), len(reqs))) % n).tolist()
    i = 0
    s = t0
    while s < t1 - 1e-9:
        e = min(t1, s + fleet.route_dt_s)
        load = [r.ongoing for r in sims]
        while i < len(reqs) and reqs[i][0] < e:
            a, b = first[i], other[i]  # two different replicas (the same one when there is only one)
            k = a if load[a] <= load[b] else b
            r = sims[k]
            if len(r.waiting) >= r.sh.spec.max_waiting:
                res.rejected += 1
            else:
                r.waiting.append(reqs[i])
                load[k] += 1
            i += 1
        for r in sims:
            r.run_until(e)
        for r, _ in draining:
            r.run_until(e)
        s = e


def _resize(new: int, target: int, ready: int, sims, starting, draining, t, fleet) -> int:
    """Apply a new target: start replicas, or stop starting ones first, then serving ones (a simulated one drains:
    it stops receiving requests and finishes what it holds). Returns the serving count."""
    for _ in range(new - target):
        starting.append(t + fleet.startup_s)
    for _ in range(target - new):
        if starting:
            starting.pop()
            continue
        ready -= 1
        if len(sims) > ready:
            r = min(sims, key=lambda x: x.ongoing)
            sims.remove(r)
            draining.append((r, t))
    return ready


def _record_tick(tl: dict, t, trace, ready, starting, draining, s: LoadSignals) -> None:
    tl["t"].append(t)
    tl["rate"].append(float(trace.rate(np.array([t]))[0]) if t <= trace.duration_s else 0.0)
    tl["target"].append(ready + len(starting))
    tl["ready"].append(ready)
    tl["allocated"].append(ready + len(starting) + len(draining))
    for k in TIMELINE_SIGNALS:
        tl[k].append(getattr(s, k))
