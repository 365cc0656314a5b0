"""Prometheus metrics of the app, aggregated over every replica, and the replica's fresh load signals.

Aggregation (push to a hub): every LLM replica and every ingress replica keeps its own prometheus-client objects
and, once a second (`MetricsOptions.push_interval_s`), a daemon thread pushes a snapshot of its samples (plain
tuples) to `MetricsHub`, a one-replica Serve deployment of the same application (so Serve starts, restarts and
deletes it with the app, on any node). The hub keeps the latest snapshot per source and forgets sources that stopped
pushing (`stale_after_s`: a replica that died or was scaled down). `GET /metrics` on the ingress asks the hub for
all snapshots, swaps in its own live one, adds `replica="<Serve replica id>"` to every sample and renders Prometheus
text with prometheus-client. Replicas push (rather than the ingress pulling) because Serve has no API to call every
replica of a deployment; a snapshot is cumulative, so a lost push or a restarted hub loses nothing but one second.

Names: see ENGINE_COUNTERS, ENGINE_GAUGES, HISTOGRAMS below (agreed with dashboards/grafana_dspark.json). Counters are
monotonic and exposed as `<name>_total` (prometheus-client's own suffix), without `_created` samples, so tools that
sum every `*spec_decode_num_drafts*` line (`vllm bench serve`) read the right numbers. The engine-derived counters
are the engine's own cumulative counters, copied, so they equal `LLMEngine.stats()` exactly.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import Metric


log = logging.getLogger("ray.serve")

PREFIX = "dspark:"
Sample = tuple[str, dict, float]
Family = dict  # {"name", "type", "help", "samples": [Sample]} -- plain data, cheap to pickle

# (family name, help, engine stats path). Exposed as <name>_total.
ENGINE_COUNTERS = [
    ("generation_tokens", "Output tokens generated", ("generation_tokens",)),
    ("prompt_tokens", "Prompt (and recomputed) tokens run through the model", ("prompt_tokens",)),
    ("num_preemptions", "Sequences preempted (recomputed later)", ("preemptions",)),
    ("spec_decode_num_drafts", "Sequence-steps that verified at least one draft token", ("spec", "drafts")),
    ("spec_decode_num_draft_tokens", "Draft tokens verified", ("spec", "draft_tokens")),
    ("spec_decode_num_accepted_tokens", "Draft tokens accepted", ("spec", "accepted_tokens")),
    ("draft_fallbacks", "Draft-service failures that fell back to plain decoding", ("spec", "fallbacks")),
]
# (family name, help). Values come from ReplicaMetrics.gauge_values.
ENGINE_GAUGES = [
    ("num_requests_running", "Sequences running"),
    ("num_requests_waiting", "Requests waiting for admission"),
    ("kv_cache_usage_perc", "Share of KV blocks in use (0..1)"),
    ("kv_blocks_used", "KV blocks in use"),
    ("kv_blocks_total", "KV blocks in the cache"),
    ("seq_occupancy", "Load signal: running / max_num_seqs (running average)"),
    ("token_occupancy", "Load signal: tokens per step / token budget (running average)"),
    ("verify_tokens_per_step", "Load signal: draft tokens verified per step (running average)"),
    ("verify_tokens_per_seq", "Load signal: draft tokens verified per decoding sequence (running average)"),
    ("spec_squeezed", "Load signal: share of recent steps where load left speculation nothing to verify"),
    ("speculation_enabled", "1 when this replica speculates"),
    ("drafter_error", "1 when the drafter could not load and this replica serves without speculation"),
    ("draft_contexts_live", "Draft contexts held by this replica's draft service"),
    ("replica_rss_bytes", "Resident memory of the replica process"),
]
# Latency buckets: vLLM's, plus the millisecond range a CPU replica of a small model lives in.
HISTOGRAMS = [
    ("time_to_first_token_seconds", "Time to first token", "ttft_s",
     (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
      160.0, 640.0, 2560.0)),
    ("time_per_output_token_seconds", "Time per output token after the first", "tpot_s",
     (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
      10.0, 20.0, 40.0, 80.0)),
    ("e2e_request_latency_seconds", "Request latency, arrival to the last token", "e2e_s",
     (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
      240.0, 480.0, 960.0, 1920.0, 7680.0)),
]
FINISH_REASONS = ("stop", "length", "abort")
# A few gauges also go through Ray's metrics agent (`ray_<name>` on every node's metrics export port).
RAY_GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "seq_occupancy",
              "token_occupancy", "spec_squeezed", "speculation_enabled")


# ----- snapshots of prometheus-client objects --------------------------------------------------------------------


def families_of(registry: CollectorRegistry) -> list[Family]:
    """A registry's metrics as plain data, without prometheus-client's `_created` samples."""
    out = []
    for m in registry.collect():
        samples = [(s.name, dict(s.labels), float(s.value)) for s in m.samples if not s.name.endswith("_created")]
        out.append({"name": m.name, "type": m.type, "help": m.documentation, "samples": samples})
    return out


def _family(name: str, kind: str, doc: str, samples: list[Sample]) -> Family:
    return {"name": PREFIX + name, "type": kind, "help": doc, "samples": samples}


def _get(stats: Mapping, path: tuple[str, ...], default=0):
    node = stats
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return default
        node = node[key]
    return node


def _float(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return 0.0


class ReplicaMetrics:
    """One LLM replica's metrics: per-request histograms and outcomes (observed by the replica's handlers) and the
    engine's counters and gauges (copied from its published stats at every snapshot)."""

    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=False)
        self.request_success = Counter(PREFIX + "request_success", "Finished requests by finish reason",
                                       ["finished_reason"], registry=self.registry)
        for reason in FINISH_REASONS:
            self.request_success.labels(reason)  # every series exists from the start (rates need two points)
        self.histograms = {key: Histogram(PREFIX + name, doc, buckets=buckets, registry=self.registry)
                           for name, doc, key, buckets in HISTOGRAMS}

    def observe_finished(self, finish_reason: str | None, metrics: Mapping | None) -> None:
        """A request that finished (stop/length) or was aborted (client gone, cancelled): count it and, when it
        finished, observe its latencies (RequestOutput.metrics: ttft_s, tpot_s, e2e_s)."""
        reason = finish_reason if finish_reason in FINISH_REASONS else "abort"
        self.request_success.labels(reason).inc()
        if reason == "abort":
            return
        for key, hist in self.histograms.items():
            v = (metrics or {}).get(key)
            if v is not None and math.isfinite(v) and v >= 0:
                hist.observe(v)

    @staticmethod
    def gauge_values(stats: Mapping, signals: Mapping[str, float], *, draft_contexts_live: float = 0.0,
                     rss_bytes: float = 0.0) -> dict[str, float]:
        return {
            "num_requests_running": _float(stats.get("num_running")),
            "num_requests_waiting": _float(stats.get("num_waiting")),
            "kv_cache_usage_perc": _float(stats.get("kv_usage")),
            "kv_blocks_used": _float(stats.get("kv_blocks_used")),
            "kv_blocks_total": _float(stats.get("kv_blocks_total")),
            **{k: _float(signals.get(k)) for k in ("seq_occupancy", "token_occupancy", "verify_tokens_per_step",
                                                    "verify_tokens_per_seq", "spec_squeezed")},
            "speculation_enabled": 1.0 if stats.get("speculation") else 0.0,
            "drafter_error": 1.0 if stats.get("drafter_error") else 0.0,
            "draft_contexts_live": _float(draft_contexts_live),
            "replica_rss_bytes": _float(rss_bytes),
        }

    def families(self, stats: Mapping, gauges: Mapping[str, float]) -> list[Family]:
        """The whole snapshot: engine counters (exact copies of `stats`), gauges, then the registry."""
        out = []
        for name, doc, path in ENGINE_COUNTERS:
            out.append(_family(name, "counter", doc, [(PREFIX + name + "_total", {}, _float(_get(stats, path)))]))
        spec = stats.get("spec") or {}
        per_pos = spec.get("accepted_per_pos") or []
        out.append(_family("spec_decode_num_accepted_tokens_per_pos", "counter",
                           "Draft tokens accepted, by position in the draft block",
                           [(PREFIX + "spec_decode_num_accepted_tokens_per_pos_total", {"position": str(i)},
                             _float(v)) for i, v in enumerate(per_pos)]))
        hist = spec.get("verify_length_hist") or []
        out.append(_family("spec_decode_verify_length", "counter",
                           "Drafted sequence-steps by the number of draft tokens verified (the controller's choice)",
                           [(PREFIX + "spec_decode_verify_length_total", {"length": str(i)}, _float(v))
                            for i, v in enumerate(hist)]))
        docs = dict(ENGINE_GAUGES)
        for name, _ in ENGINE_GAUGES:
            out.append(_family(name, "gauge", docs[name], [(PREFIX + name, {}, _float(gauges.get(name)))]))
        return out + families_of(self.registry)


class IngressMetrics:
    """HTTP-level metrics of one ingress replica (observed by a middleware)."""

    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(PREFIX + "http_requests", "HTTP requests by route and status code",
                                ["route", "status"], registry=self.registry)
        self.latency = Histogram(PREFIX + "http_request_duration_seconds",
                                 "Time until the response headers (streams: until every choice was admitted)",
                                 ["route"], registry=self.registry,
                                 buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                                          60.0, 120.0, 300.0))

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(max(0.0, seconds))

    def families(self) -> list[Family]:
        return families_of(self.registry)


_INGRESS_METRICS: IngressMetrics | None = None


def ingress_metrics() -> IngressMetrics:
    """The process's IngressMetrics (one ingress replica per process). A function, not a module global of the
    ingress: Serve pickles the ingress class's route methods with copies of the globals they use, so a global object
    would be one copy in the middleware and another in the /metrics route; a function is pickled by reference."""
    global _INGRESS_METRICS
    if _INGRESS_METRICS is None:
        _INGRESS_METRICS = IngressMetrics()
    return _INGRESS_METRICS


# ----- rendering ---------------------------------------------------------------------------------------------------


def render(sources: Mapping[str, Mapping], now: float | None = None) -> bytes:
    """Prometheus text (format 0.0.4) of every source's families, each sample labelled `replica="<source>"`, plus
    `dspark:metrics_age_seconds{replica}` (how old each source's snapshot is). `sources`: source id ->
    {"time": unix seconds, "families": [Family]} (MetricsHub.snapshot)."""
    now = time.time() if now is None else now
    merged: dict[str, Metric] = {}
    ages = Metric(PREFIX + "metrics_age_seconds", "Age of each replica's last metrics snapshot", "gauge")
    for source in sorted(sources):
        entry = sources[source]
        ages.add_sample(PREFIX + "metrics_age_seconds", {"replica": source}, max(0.0, now - entry["time"]))
        for fam in entry["families"]:
            m = merged.get(fam["name"])
            if m is None:
                m = merged[fam["name"]] = Metric(fam["name"], fam["help"], fam["type"])
            elif m.type != fam["type"]:
                continue  # two sources disagree (mixed versions during a redeploy): keep the first
            for name, labels, value in fam["samples"]:
                m.add_sample(name, {**labels, "replica": source}, value)

    class _Collector:
        def collect(self):
            yield from merged.values()
            yield ages

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return generate_latest(registry)


# ----- the hub -----------------------------------------------------------------------------------------------------


class MetricsHub:
    """The latest metrics snapshot of every replica (LLM and ingress) that pushes to it. Serve deployment, one
    replica, no resources; stateless apart from those snapshots, which the replicas resend every second."""

    def __init__(self, stale_after_s: float = 10.0):
        self.stale_after_s = stale_after_s
        self._sources: dict[str, dict] = {}

    # async: every call runs on the replica's event loop, one at a time (no locking needed).
    async def push(self, source: str, families: list[Family]) -> None:
        self._sources[source] = {"time": time.time(), "families": families}

    async def forget(self, source: str) -> None:
        self._sources.pop(source, None)

    async def snapshot(self) -> dict[str, dict]:
        cutoff = time.time() - self.stale_after_s
        for source in [s for s, e in self._sources.items() if e["time"] < cutoff]:
            del self._sources[source]
        return dict(self._sources)


class MetricsPusher:
    """A daemon thread that pushes `collect()` to the hub every `interval_s` (blocking handle calls, so it never
    touches the replica's event loop). Failures are logged once per minute and retried at the next tick."""

    def __init__(self, hub, source: str, collect: Callable[[], list[Family]], interval_s: float = 1.0,
                 timeout_s: float = 10.0):
        self.hub, self.source, self.collect = hub, source, collect
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.pushes = 0
        self._stop = threading.Event()
        self._last_warning = 0.0
        self._thread = threading.Thread(target=self._run, name="metrics-push", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                families = self.collect()
                self.hub.push.remote(self.source, families).result(timeout_s=self.timeout_s)
                self.pushes += 1
            except Exception as exc:
                if self._stop.is_set():
                    break
                if time.monotonic() - self._last_warning > 60:
                    self._last_warning = time.monotonic()
                    log.warning("metrics push from %s failed (retrying every %.1f s): %r", self.source,
                                self.interval_s, exc)
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def stop(self) -> None:
        self._stop.set()


# ----- load signals and process numbers ----------------------------------------------------------------------------


def process_rss_bytes(pid: int | str = "self") -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        try:
            import psutil

            return float(psutil.Process(None if pid == "self" else int(pid)).memory_info().rss)
        except Exception:
            return 0.0


class RayGauges:
    """RAY_GAUGES through Ray's metrics agent (ray.util.metrics), tagged with the replica: Ray's own dashboards and
    its Prometheus export (`ray_dspark_<name>`) show them without scraping the app. No-op outside a Ray worker."""

    def __init__(self, tags: Mapping[str, str]):
        self.gauges = {}
        try:
            import ray
            from ray.util import metrics

            if not ray.is_initialized():
                return
            for name in RAY_GAUGES:
                g = metrics.Gauge("dspark_" + name, description=dict(ENGINE_GAUGES)[name], tag_keys=tuple(tags))
                g.set_default_tags(dict(tags))
                self.gauges[name] = g
        except Exception as exc:  # metrics are an extra: never fail a replica over them
            log.warning("Ray metrics unavailable: %r", exc)
            self.gauges = {}

    def set(self, values: Mapping[str, float]) -> None:
        for name, g in self.gauges.items():
            try:
                g.set(float(values.get(name, 0.0)))
            except Exception:
                pass
