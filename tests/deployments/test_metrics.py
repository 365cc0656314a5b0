"""Prometheus metrics at the ingress's /metrics, aggregated over replicas (deployments/metrics.py).

Without a cluster: the rendered names (exactly the agreed ones, counters with `_total` and no `_created`), the
replica label, vLLM's families (names, types, labels, buckets), and the idle decay of the load signals. With a
local Ray: an app of two LLM replicas (tiny random models, a tiny drafter in co-located draft actors, `fixed:3`
speculation) whose /metrics has every metric with a `replica` label for both replicas; counters move under load; and every engine counter in /metrics equals the
engine's own (`LLMServer.stats()`) once idle.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families

from deployments.launch import run_app
from deployments.metrics import IngressMetrics, ReplicaMetrics, render

COUNTERS = ["vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:request_success_total",
            "vllm:num_preemptions_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
            "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total",
            "dspark:spec_decode_verify_length_total", "dspark:draft_fallbacks_total"]
GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
          "dspark:seq_occupancy", "dspark:token_occupancy", "dspark:verify_tokens_per_step",
          "dspark:verify_tokens_per_seq", "dspark:spec_squeezed", "dspark:speculation_enabled",
          "dspark:kv_blocks_used", "dspark:draft_contexts_live", "dspark:replica_rss_bytes", "dspark:drafter_error"]
HISTOGRAMS = ["vllm:time_to_first_token_seconds", "vllm:request_time_per_output_token_seconds",
              "vllm:e2e_request_latency_seconds", "vllm:inter_token_latency_seconds"]
REPLICA_METRICS = COUNTERS + GAUGES + [h + "_bucket" for h in HISTOGRAMS] + [h + "_count" for h in HISTOGRAMS]
LOAD_KEYS = {"queue_depth", "running", "kv_usage", "seq_occupancy", "token_occupancy", "verify_tokens_per_step",
             "verify_tokens_per_seq", "spec_squeezed"}


def parse(text: str) -> list[tuple[str, dict, float]]:
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def value(samples, name: str, **labels) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    return sum(v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items()))


def fake_stats(**over) -> dict:
    stats = {"num_running": 0, "num_waiting": 0, "kv_usage": 0.25, "kv_blocks_used": 5, "kv_blocks_total": 20,
             "generation_tokens": 10, "prompt_tokens": 7, "preemptions": 0, "prefix_cache_queries": 40,
             "prefix_cache_hits": 32, "speculation": True,
             "drafter_error": None, "max_num_seqs": 4, "max_num_batched_tokens": 64, "time": time.time(),
             "load": {"queue_depth": 1.0, "running": 2.0, "kv_usage": 0.25, "seq_occupancy": 0.5,
                      "token_occupancy": 0.4, "verify_tokens_per_step": 3.0, "verify_tokens_per_seq": 1.5,
                      "spec_squeezed": 0.3},
             "spec": {"drafts": 3, "draft_tokens": 9, "accepted_tokens": 4, "accepted_per_pos": [3, 1, 0],
                      "verify_length_hist": [0, 1, 1, 1], "fallbacks": 2}}
    stats.update(over)
    return stats


# ----- without a cluster -----------------------------------------------------------------------------------------


def test_render_names_labels_and_engine_counters():
    m = ReplicaMetrics()
    m.observe_finished("length", {"ttft_s": 0.02, "tpot_s": 0.003, "e2e_s": 0.4})
    m.observe_finished("stop", {"ttft_s": 0.01})
    m.observe_finished(None, {"ttft_s": 5.0})  # aborted: counted, latencies not observed
    stats = fake_stats()
    families = m.families(stats, ReplicaMetrics.gauge_values(stats, stats["load"], rss_bytes=1e6))
    ingress = IngressMetrics()
    ingress.observe("/v1/completions", 200, 0.1)
    text = render({"r1": {"time": time.time(), "families": families},
                   "r2": {"time": time.time() - 3, "families": families},
                   "ing": {"time": time.time(), "families": ingress.families()}}).decode()
    assert "_created" not in text  # `vllm bench serve` sums every line containing e.g. "num_drafts"
    samples = parse(text)
    names = {n for n, _, _ in samples}
    assert set(REPLICA_METRICS) <= names, set(REPLICA_METRICS) - names
    for name in REPLICA_METRICS:
        assert {lab["replica"] for n, lab, _ in samples if n == name} == {"r1", "r2"}, name
    drafts_lines = [line for line in text.splitlines() if "spec_decode_num_drafts" in line and line[0] != "#"]
    assert [line.split("{")[0] for line in drafts_lines] == ["vllm:spec_decode_num_drafts_total"] * 2  # once each
    for name in names:  # one name per quantity: no dspark: twin of a vLLM family
        assert not (name.startswith("dspark:") and "vllm:" + name.removeprefix("dspark:") in names), name
    assert value(samples, "vllm:spec_decode_num_drafts_total", replica="r1") == 3
    assert value(samples, "vllm:spec_decode_num_accepted_tokens_per_pos_total", replica="r2", position="1") == 1
    assert value(samples, "dspark:spec_decode_verify_length_total", replica="r1", length="3") == 1
    assert value(samples, "dspark:draft_fallbacks_total", replica="r1") == 2
    assert value(samples, "vllm:request_success_total", replica="r1", finished_reason="abort") == 1
    assert value(samples, "vllm:request_success_total", replica="r1", finished_reason="length") == 1
    assert value(samples, "vllm:time_to_first_token_seconds_count", replica="r1") == 2
    assert value(samples, "vllm:request_time_per_output_token_seconds_count", replica="r1") == 1
    assert value(samples, "dspark:kv_blocks_used", replica="r2") == 5
    assert value(samples, "dspark:speculation_enabled", replica="r1") == 1
    assert value(samples, "dspark:drafter_error", replica="r1") == 0
    assert value(samples, "dspark:http_requests_total", replica="ing", route="/v1/completions", status="200") == 1
    assert 2.5 < value(samples, "dspark:metrics_age_seconds", replica="r2") < 10


VLLM_COUNTERS = {"vllm:prompt_tokens": 7, "vllm:generation_tokens": 10, "vllm:num_preemptions": 0,
                 "vllm:prefix_cache_queries": 40, "vllm:prefix_cache_hits": 32,
                 "vllm:spec_decode_num_drafts": 3, "vllm:spec_decode_num_draft_tokens": 9,
                 "vllm:spec_decode_num_accepted_tokens": 4}  # fake_stats' values
VLLM_HISTOGRAM_BUCKETS = {  # vLLM v1's bounds (vllm/v1/metrics/loggers.py); token counts 1-2-5 up to max_model_len
    "vllm:time_to_first_token_seconds": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                                         5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0],
    "vllm:inter_token_latency_seconds": [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                                         7.5, 10.0, 20.0, 40.0, 80.0],
    "vllm:e2e_request_latency_seconds": [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                                         60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0],
    "vllm:request_prompt_tokens": [1, 2, 5, 10, 20, 50, 100],
    "vllm:iteration_tokens_total": [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
}


def test_vllm_families_have_vllms_names_types_labels_and_buckets():
    """The `vllm:` families a vLLM dashboard reads: vLLM's type, `model_name` and `engine` labels, bucket bounds, and
    values equal to the engine's counters; the engine's own histograms re-bucketed to vLLM's bounds count exactly
    the observations at or under each bound."""
    from dataclasses import asdict

    from engine.llm_engine import INTER_TOKEN_LATENCY_BOUNDS_S, ITERATION_TOKENS_BOUNDS, Histogram

    itl = Histogram(INTER_TOKEN_LATENCY_BOUNDS_S)
    itl_values = [0.004, 0.01, 0.0101, 0.3, 0.3, 95.0]
    for v in itl_values:
        itl.observe(v)
    tokens = Histogram(ITERATION_TOKENS_BOUNDS)
    for v in (1, 9, 64, 20000):
        tokens.observe(v)
    m = ReplicaMetrics("tiny-model", max_model_len=100)
    m.observe_finished("length", {"ttft_s": 0.02, "tpot_s": 0.003, "e2e_s": 0.4, "queue_s": 0.001, "prefill_s": 0.019,
                                  "decode_s": 0.38, "inference_s": 0.399, "num_prompt_tokens": 12,
                                  "num_output_tokens": 40})
    m.observe_finished(None, {"ttft_s": 5.0})
    stats = fake_stats(inter_token_latency_s=asdict(itl), iteration_tokens=asdict(tokens))
    families = m.families(stats, ReplicaMetrics.gauge_values(stats, stats["load"]))
    text = render({"r1": {"time": time.time(), "families": families}}).decode()
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    samples = parse(text)
    mine = {"model_name": "tiny-model", "engine": "0", "replica": "r1"}
    for name, expected in VLLM_COUNTERS.items():
        assert parsed[name].type == "counter", name
        assert [(lab, v) for n, lab, v in samples if n == name + "_total"] == [(mine, expected)], name
    assert value(samples, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position="0", **mine) == 3
    for name, expected in [("vllm:num_requests_running", 0), ("vllm:num_requests_waiting", 0),
                           ("vllm:kv_cache_usage_perc", 0.25)]:
        assert parsed[name].type == "gauge" and value(samples, name, **mine) == expected, name
    assert value(samples, "vllm:request_success_total", finished_reason="length", **mine) == 1
    assert value(samples, "vllm:request_success_total", finished_reason="abort", **mine) == 1
    for name in ["vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_time_per_output_token_seconds", "vllm:request_queue_time_seconds",
                 "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                 "vllm:request_inference_time_seconds", "vllm:request_prompt_tokens",
                 "vllm:request_generation_tokens"]:
        assert parsed[name].type == "histogram", name
        assert value(samples, name + "_count", **mine) == 1, name  # the aborted request is not observed
    assert value(samples, "vllm:request_prompt_tokens_sum", **mine) == 12
    for name, bounds in VLLM_HISTOGRAM_BUCKETS.items():
        les = [lab["le"] for n, lab, _ in samples if n == name + "_bucket" and lab["model_name"] == "tiny-model"]
        assert les == [str(float(b)) for b in bounds] + ["+Inf"], name
    for b in VLLM_HISTOGRAM_BUCKETS["vllm:inter_token_latency_seconds"]:
        assert value(samples, "vllm:inter_token_latency_seconds_bucket", le=str(float(b)), **mine) == sum(
            v <= b for v in itl_values), b
    assert value(samples, "vllm:inter_token_latency_seconds_count", **mine) == len(itl_values)
    assert value(samples, "vllm:inter_token_latency_seconds_sum", **mine) == pytest.approx(sum(itl_values))
    assert value(samples, "vllm:iteration_tokens_total_bucket", le="+Inf", **mine) == 4
    assert value(samples, "vllm:iteration_tokens_total_bucket", le="8.0", **mine) == 1


def replica_stats(handle, n: int, timeout: float = 60) -> dict[str, dict]:
    """`stats()` of each of the n LLM replicas (the router picks replicas at random)."""
    seen: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < n:
        assert time.monotonic() < deadline, f"saw only replicas {sorted(seen)}"
        s = handle.stats.remote().result()
        seen[s["replica"]] = s
    return seen


@pytest.fixture(scope="module")
def server(serve_port, tmp_path_factory, default_tokenizer):
    from deployments.config import LLMServingConfig
    from engine import EngineConfig
    from tests.helpers import make_tiny_model
    from tests.helpers import make_tiny_drafter

    folder = tmp_path_factory.mktemp("metrics")
    target = make_tiny_model("llama", folder / "target", default_tokenizer)
    drafter = make_tiny_drafter(folder / "drafter", len(default_tokenizer))
    engine_cfg = EngineConfig(model=str(target), dtype="float32", device="cpu", kv_cache_memory_gb=0.02,
                              drafter=str(drafter), speculation="fixed:3", max_num_seqs=4,
                              max_num_batched_tokens=128)
    config = LLMServingConfig(engine=engine_cfg, served_model_name="tiny", drafter_mode="actor", num_replicas=2)
    app = run_app(config, serve_port)
    handle = app.handle()
    return SimpleNamespace(base=app.base, handle=handle, replicas=set(replica_stats(handle, 2)))


def scrape(server) -> list[tuple[str, dict, float]]:
    r = httpx.get(f"{server.base}/metrics", timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return parse(r.text)


def wait_metrics(server, check, timeout: float = 30.0):
    """Scrape until `check(samples)` holds (replicas push once a second); return the samples."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(server)
        if check(samples):
            return samples
        assert time.monotonic() < deadline, "metrics did not reach the expected state"
        time.sleep(0.5)


@pytest.mark.slow
def test_metrics_has_every_name_for_both_replicas(server):
    def complete(samples):
        return all({lab.get("replica") for n, lab, _ in samples if n == name} >= server.replicas
                   for name in REPLICA_METRICS)

    samples = wait_metrics(server, complete)
    assert {lab["replica"] for n, lab, _ in samples if n == "vllm:num_requests_running"} == server.replicas
    assert all(value(samples, "dspark:speculation_enabled", replica=r) == 1 for r in server.replicas)
    assert all(value(samples, "dspark:drafter_error", replica=r) == 0 for r in server.replicas)
    assert all(value(samples, "dspark:replica_rss_bytes", replica=r) > 50e6 for r in server.replicas)
    # The HTTP routes' own metrics (the scrapes above counted; each replica serving HTTP counts its own, and a
    # scrape shows another replica's within a push), and how fresh every source's snapshot is.
    samples = wait_metrics(server, lambda s: value(s, "dspark:http_requests_total", route="/metrics",
                                                   status="200") >= 1)
    ages = {lab["replica"]: v for n, lab, v in samples if n == "dspark:metrics_age_seconds"}
    assert server.replicas <= set(ages) and all(v < 5 for v in ages.values()), ages


@pytest.mark.slow
def test_counters_move_under_load_and_match_the_engine(server):
    before = wait_metrics(server, lambda s: value(s, "vllm:num_requests_running") == 0)
    n = 12
    body = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    with httpx.Client(base_url=server.base, timeout=120) as client, ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: client.post("/v1/completions", json=body), range(n)))
    assert all(r.status_code == 200 for r in results), [r.text for r in results if r.status_code != 200]
    completion_tokens = sum(r.json()["usage"]["completion_tokens"] for r in results)
    assert completion_tokens == n * 24

    def delta(samples, name, **labels):
        return value(samples, name, **labels) - value(before, name, **labels)

    # Both replicas idle again (no running sequence, no block, no draft context), their last pushes in.
    stats = replica_stats(server.handle, 2)
    idle = all(s["num_running"] == 0 and s["kv_blocks_used"] == 0 for s in stats.values())
    assert idle, stats
    after = wait_metrics(server, lambda s: delta(s, "vllm:request_success_total") == n
                         and value(s, "dspark:draft_contexts_live") == 0 and value(s, "dspark:kv_blocks_used") == 0)
    assert delta(after, "vllm:request_success_total", finished_reason="length", model_name="tiny") == n
    assert delta(after, "vllm:generation_tokens_total") == completion_tokens
    assert delta(after, "vllm:prompt_tokens_total") >= n * 4
    assert delta(after, "vllm:spec_decode_num_drafts_total") > 0
    for h in ["vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
              "vllm:request_time_per_output_token_seconds", "vllm:request_queue_time_seconds",
              "vllm:request_prompt_tokens", "vllm:request_generation_tokens"]:
        assert delta(after, h + "_count", model_name="tiny") == n, h
        assert delta(after, h + "_bucket", le="+Inf") == n, h
    assert delta(after, "dspark:http_requests_total", route="/v1/completions", status="200") == n
    assert delta(after, "vllm:request_generation_tokens_sum") == completion_tokens
    # every step after a request's first token: (24 - 1) observations at most per request, fewer as drafts accept
    assert 0 < delta(after, "vllm:inter_token_latency_seconds_count") <= n * 23

    # Every engine counter equals the engine's own, replica by replica (the engine is idle: its stats are final).
    stats = replica_stats(server.handle, 2)
    expected = {}
    for rid, s in stats.items():
        spec = s["spec"]
        expect = {("dspark:draft_fallbacks_total", ()): spec["fallbacks"]}
        for length, v in enumerate(spec["verify_length_hist"]):
            expect[("dspark:spec_decode_verify_length_total", (("length", str(length)),))] = v
        tiny = (("model_name", "tiny"), ("engine", "0"))
        expect.update({("vllm:generation_tokens_total", tiny): s["generation_tokens"],
                       ("vllm:prompt_tokens_total", tiny): s["prompt_tokens"],
                       ("vllm:num_preemptions_total", tiny): s["preemptions"],
                       ("vllm:prefix_cache_queries_total", tiny): s["prefix_cache_queries"],
                       ("vllm:prefix_cache_hits_total", tiny): s["prefix_cache_hits"],
                       ("vllm:spec_decode_num_drafts_total", tiny): spec["drafts"],
                       ("vllm:spec_decode_num_draft_tokens_total", tiny): spec["draft_tokens"],
                       ("vllm:spec_decode_num_accepted_tokens_total", tiny): spec["accepted_tokens"],
                       ("vllm:inter_token_latency_seconds_count", tiny): s["inter_token_latency_s"]["count"],
                       ("vllm:iteration_tokens_total_count", tiny): s["iteration_tokens"]["count"]})
        for pos, v in enumerate(spec["accepted_per_pos"]):
            expect[("vllm:spec_decode_num_accepted_tokens_per_pos_total", (*tiny, ("position", str(pos))))] = v
        expected.update({(rid, *k): float(v) for k, v in expect.items()})
        assert sum(spec["accepted_per_pos"]) == spec["accepted_tokens"]

    def got(samples):
        return {key: value(samples, key[1], replica=key[0], **dict(key[2])) for key in expected}

    try:
        wait_metrics(server, lambda samples: got(samples) == expected, timeout=10)
    except AssertionError:
        assert got(scrape(server)) == expected
    assert sum(s["spec"]["drafts"] for s in stats.values()) == value(scrape(server),
                                                                       "vllm:spec_decode_num_drafts_total")


@pytest.mark.slow
def test_record_autoscaling_stats_are_the_load_signals(server):
    from autoscale.policy import METRICS

    t0 = time.perf_counter()
    out = server.handle.record_autoscaling_stats.remote().result()
    assert time.perf_counter() - t0 < 5
    assert set(out) == LOAD_KEYS and set(METRICS) <= set(out)
    assert all(type(v) is float for v in out.values())


@pytest.mark.slow
def test_key_gauges_also_go_through_rays_metrics_agent(server):
    port = ray.nodes()[0]["MetricsExportPort"]
    deadline = time.monotonic() + 60  # Ray's agent exports every few seconds
    while True:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        found = {lab.get("replica") for n, lab, _ in parse(text) if n == "ray_dspark_num_requests_running"}
        if found >= server.replicas:
            break
        assert time.monotonic() < deadline, f"Ray's export has ray_dspark_num_requests_running for {found}"
        time.sleep(1)
    assert "ray_dspark_kv_cache_usage_perc" in text and "ray_dspark_seq_occupancy" in text
