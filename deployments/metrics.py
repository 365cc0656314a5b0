"""Prometheus metrics of the app, aggregated over every replica, and the replica's fresh load signals.

Aggregation (push to a hub): every LLM replica and every ingress replica keeps its own prometheus-client objects
and, once a second (`MetricsOptions.push_interval_s`), a daemon thread pushes a snapshot of its samples (plain
tuples) to `MetricsHub`, a one-replica Serve deployment of the same application (so Serve starts, restarts and
deletes it with the app, on any node). The hub keeps the latest snapshot per source and forgets sources that stopped
pushing (`stale_after_s`: a replica that died or was scaled down). `GET /metrics` on the ingress asks the hub for
all snapshots, swaps in its own live one, adds `replica="<Serve replica id>"` to every sample and renders Prometheus
text with prometheus-client. Replicas push (rather than the ingress pulling) because Serve has no API to call every
replica of a deployment; a snapshot is cumulative, so a lost push or a restarted hub loses nothing but one second.

Names: every quantity vLLM publishes goes out under vLLM's name (VLLM_* below), with vLLM's type, labels
(`model_name`, `engine`) and bucket bounds, so vLLM's dashboards, alerts and autoscaling recipes read this server as
they read vLLM. `dspark:` names only what vLLM has no name for (ENGINE_COUNTERS, ENGINE_GAUGES: load signals,
verify lengths, draft fallbacks, KV blocks). Each quantity has one name, so tools that sum every line containing
`spec_decode_num_drafts` (`vllm bench serve`) count it once. Names agree with dashboards/grafana_dspark.json.
Counters are monotonic and exposed as `<name>_total` (prometheus-client's own suffix), without `_created` samples.
The engine-derived counters are the engine's own cumulative counters, copied, so they equal `LLMEngine.stats()`.
"""
from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString


log = logging.getLogger("ray.serve")

PREFIX = "dspark:"
Sample = tuple[str, dict, float]
Family = dict  # {"name", "type", "help", "samples": [Sample]} -- plain data, cheap to pickle

# (family name, help, engine stats path). Exposed as <name>_total.
ENGINE_COUNTERS = [
    ("draft_fallbacks", "Draft-service failures that fell back to plain decoding", ("spec", "fallbacks")),
]
# (family name, help). Values come from ReplicaMetrics.gauge_values; those vLLM names too go out as vLLM's only.
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
FINISH_REASONS = ("stop", "length", "abort")

# vLLM's families, as vLLM v1 publishes them (vllm/v1/metrics/loggers.py).
VLLM_PREFIX = "vllm:"
VLLM_LABELS = ("model_name", "engine")
VLLM_ENGINE_COUNTERS = [  # (family, help, engine stats path), exposed as <family>_total
    ("prompt_tokens", "Number of prefill tokens processed.", ("prompt_tokens",)),
    ("generation_tokens", "Number of generation tokens processed.", ("generation_tokens",)),
    ("num_preemptions", "Cumulative number of preemption from the engine.", ("preemptions",)),
    ("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
     ("prefix_cache_queries",)),
    ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", ("prefix_cache_hits",)),
    ("spec_decode_num_drafts", "Number of spec decoding drafts.", ("spec", "drafts")),
    ("spec_decode_num_draft_tokens", "Number of draft tokens.", ("spec", "draft_tokens")),
    ("spec_decode_num_accepted_tokens", "Number of accepted tokens.", ("spec", "accepted_tokens")),
]
VLLM_GAUGES = [  # (family, help, the ENGINE_GAUGES value it publishes)
    ("num_requests_running", "Number of requests in model execution batches.", "num_requests_running"),
    ("num_requests_waiting", "Number of requests waiting to be processed.", "num_requests_waiting"),
    ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "kv_cache_usage_perc"),
]
VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                     40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                              20.0, 40.0, 80.0)
VLLM_REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                                240.0, 480.0, 960.0, 1920.0, 7680.0)
VLLM_ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# Per finished request: (family, help, RequestOutput.metrics key, buckets; None = 1-2-5 up to max_model_len).
VLLM_REQUEST_HISTOGRAMS = [
    ("time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft_s", VLLM_TTFT_BUCKETS),
    ("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e_s",
     VLLM_REQUEST_LATENCY_BUCKETS),
    ("request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", "tpot_s",
     VLLM_TOKEN_LATENCY_BUCKETS),
    ("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", "queue_s",
     VLLM_REQUEST_LATENCY_BUCKETS),
    ("request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", "inference_s",
     VLLM_REQUEST_LATENCY_BUCKETS),
    ("request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", "prefill_s",
     VLLM_REQUEST_LATENCY_BUCKETS),
    ("request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", "decode_s",
     VLLM_REQUEST_LATENCY_BUCKETS),
    ("request_prompt_tokens", "Number of prefill tokens processed.", "num_prompt_tokens", None),
    ("request_generation_tokens", "Number of generation tokens processed.", "num_output_tokens", None),
]


def buckets_1_2_5(limit: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to `limit` (vLLM's token-count buckets)."""
    out = []
    for exponent in itertools.count():
        for mantissa in (1, 2, 5):
            value = mantissa * 10 ** exponent
            if value > limit:
                return tuple(out)
            out.append(value)
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

    def __init__(self, model_name: str = "", max_model_len: int = 8192):
        """`model_name`: the served model name (vLLM's `model_name` label); `max_model_len` bounds the token-count
        buckets."""
        self.registry = CollectorRegistry(auto_describe=False)
        self.vllm_labels = {"model_name": model_name, "engine": "0"}
        labels = tuple(self.vllm_labels.values())
        self.vllm_request_success = Counter(VLLM_PREFIX + "request_success",
                                            "Count of successfully processed requests.",
                                            [*VLLM_LABELS, "finished_reason"], registry=self.registry)
        for reason in FINISH_REASONS:
            self.vllm_request_success.labels(*labels, reason)  # every series from the start (rates need two points)
        self.vllm_histograms = {
            key: Histogram(VLLM_PREFIX + name, doc, VLLM_LABELS, registry=self.registry,
                           buckets=buckets or buckets_1_2_5(max_model_len)).labels(*labels)
            for name, doc, key, buckets in VLLM_REQUEST_HISTOGRAMS}

    def observe_finished(self, finish_reason: str | None, metrics: Mapping | None) -> None:
        """A request that finished (stop/length) or was aborted (client gone, cancelled): count it and, when it
        finished, observe its RequestOutput.metrics (the keys of VLLM_REQUEST_HISTOGRAMS)."""
        reason = finish_reason if finish_reason in FINISH_REASONS else "abort"
        self.vllm_request_success.labels(*self.vllm_labels.values(), reason).inc()
        if reason == "abort":
            return
        for key, hist in self.vllm_histograms.items():
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
        hist = (stats.get("spec") or {}).get("verify_length_hist") or []
        out.append(_family("spec_decode_verify_length", "counter",
                           "Drafted sequence-steps by the number of draft tokens verified (the controller's choice)",
                           [(PREFIX + "spec_decode_verify_length_total", {"length": str(i)}, _float(v))
                            for i, v in enumerate(hist)]))
        vllm_named = {key for _, _, key in VLLM_GAUGES}
        for name, doc in ENGINE_GAUGES:
            if name not in vllm_named:
                out.append(_family(name, "gauge", doc, [(PREFIX + name, {}, _float(gauges.get(name)))]))
        return out + self.vllm_families(stats, gauges) + families_of(self.registry)

    def vllm_families(self, stats: Mapping, gauges: Mapping[str, float]) -> list[Family]:
        """vLLM's engine-level families: counters and per-step histograms from the engine's stats, and gauges."""
        labels = self.vllm_labels
        out = []
        for name, doc, path in VLLM_ENGINE_COUNTERS:
            full = VLLM_PREFIX + name
            out.append({"name": full, "type": "counter", "help": doc,
                        "samples": [(full + "_total", labels, _float(_get(stats, path)))]})
        full = VLLM_PREFIX + "spec_decode_num_accepted_tokens_per_pos"
        per_pos = (stats.get("spec") or {}).get("accepted_per_pos") or []
        out.append({"name": full, "type": "counter", "help": "Number of accepted tokens per draft position.",
                    "samples": [(full + "_total", {**labels, "position": str(i)}, _float(v))
                                for i, v in enumerate(per_pos)]})
        for name, doc, key in VLLM_GAUGES:
            out.append({"name": VLLM_PREFIX + name, "type": "gauge", "help": doc,
                        "samples": [(VLLM_PREFIX + name, labels, _float(gauges.get(key)))]})
        out.append(engine_histogram(VLLM_PREFIX + "inter_token_latency_seconds",
                                    "Histogram of inter-token latency in seconds.", stats.get("inter_token_latency_s"),
                                    VLLM_TOKEN_LATENCY_BUCKETS, labels))
        out.append(engine_histogram(VLLM_PREFIX + "iteration_tokens_total",
                                    "Histogram of number of tokens per engine_step.", stats.get("iteration_tokens"),
                                    VLLM_ITERATION_TOKENS_BUCKETS, labels))
        return out


def engine_histogram(name: str, doc: str, hist: Mapping | None, buckets: tuple[float, ...], labels: dict) -> Family:
    """One of the engine's histograms (engine.llm_engine.Histogram, as its stats carry it) as a Prometheus histogram
    over `buckets`, each of which must be one of the engine's bounds (a missing histogram reads as empty)."""
    bounds = list(hist["bounds"]) if hist else list(buckets)
    cumulative = list(itertools.accumulate(hist["counts"])) if hist else [0] * (len(bounds) + 1)
    samples = [(name + "_bucket", {**labels, "le": floatToGoString(b)}, float(cumulative[bounds.index(b)]))
               for b in buckets]
    samples += [(name + "_bucket", {**labels, "le": "+Inf"}, float(cumulative[-1])),
                (name + "_count", labels, float(hist["count"] if hist else 0)),
                (name + "_sum", labels, float(hist["sum"] if hist else 0.0))]
    return {"name": name, "type": "histogram", "help": doc, "samples": samples}


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
