"""Prometheus metrics at the ingress's /metrics, aggregated over replicas (deployments/metrics.py).

Without a cluster: the rendered names (exactly the agreed ones, counters with `_total` and no `_created`), the
replica label, and the idle decay of the load signals. With a local Ray: an app of two LLM replicas (tiny random
models, a tiny drafter in co-located draft actors, `fixed:3` speculation) whose /metrics has every metric with a
`replica` label for both replicas; counters move under load; and every engine counter in /metrics equals the
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

COUNTERS = ["dspark:generation_tokens_total", "dspark:prompt_tokens_total", "dspark:request_success_total",
            "dspark:spec_decode_num_drafts_total", "dspark:spec_decode_num_draft_tokens_total",
            "dspark:spec_decode_num_accepted_tokens_total", "dspark:spec_decode_num_accepted_tokens_per_pos_total",
            "dspark:spec_decode_verify_length_total", "dspark:draft_fallbacks_total"]
GAUGES = ["dspark:num_requests_running", "dspark:num_requests_waiting", "dspark:kv_cache_usage_perc",
          "dspark:seq_occupancy", "dspark:token_occupancy", "dspark:verify_tokens_per_step",
          "dspark:verify_tokens_per_seq", "dspark:spec_squeezed", "dspark:speculation_enabled",
          "dspark:kv_blocks_used", "dspark:draft_contexts_live", "dspark:replica_rss_bytes", "dspark:drafter_error"]
HISTOGRAMS = ["dspark:time_to_first_token_seconds", "dspark:time_per_output_token_seconds",
              "dspark:e2e_request_latency_seconds"]
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
             "generation_tokens": 10, "prompt_tokens": 7, "preemptions": 0, "speculation": True,
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
    for line in text.splitlines():  # exactly the agreed names, as exposed (counters end in _total)
        if line.startswith("dspark:spec_decode_num_drafts"):
            assert line.startswith("dspark:spec_decode_num_drafts_total{"), line
    assert value(samples, "dspark:spec_decode_num_drafts_total", replica="r1") == 3
    assert value(samples, "dspark:spec_decode_num_accepted_tokens_per_pos_total", replica="r2", position="1") == 1
    assert value(samples, "dspark:spec_decode_verify_length_total", replica="r1", length="3") == 1
    assert value(samples, "dspark:draft_fallbacks_total", replica="r1") == 2
    assert value(samples, "dspark:request_success_total", replica="r1", finished_reason="abort") == 1
    assert value(samples, "dspark:request_success_total", replica="r1", finished_reason="length") == 1
    assert value(samples, "dspark:time_to_first_token_seconds_count", replica="r1") == 2
    assert value(samples, "dspark:time_per_output_token_seconds_count", replica="r1") == 1
    assert value(samples, "dspark:kv_blocks_used", replica="r2") == 5
    assert value(samples, "dspark:speculation_enabled", replica="r1") == 1
    assert value(samples, "dspark:drafter_error", replica="r1") == 0
    assert value(samples, "dspark:http_requests_total", replica="ing", route="/v1/completions", status="200") == 1
    assert 2.5 < value(samples, "dspark:metrics_age_seconds", replica="r2") < 10


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
    assert {lab["replica"] for n, lab, _ in samples if n == "dspark:num_requests_running"} == server.replicas
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
    before = wait_metrics(server, lambda s: value(s, "dspark:num_requests_running") == 0)
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
    after = wait_metrics(server, lambda s: delta(s, "dspark:request_success_total") == n
                         and value(s, "dspark:draft_contexts_live") == 0 and value(s, "dspark:kv_blocks_used") == 0)
    assert delta(after, "dspark:request_success_total", finished_reason="length") == n
    assert delta(after, "dspark:generation_tokens_total") == completion_tokens
    assert delta(after, "dspark:prompt_tokens_total") >= n * 4
    assert delta(after, "dspark:spec_decode_num_drafts_total") > 0
    for h in HISTOGRAMS:
        assert delta(after, h + "_count") == n, h
        assert delta(after, h + "_bucket", le="+Inf") == n, h
    assert delta(after, "dspark:http_requests_total", route="/v1/completions", status="200") == n

    # Every engine counter equals the engine's own, replica by replica (the engine is idle: its stats are final).
    stats = replica_stats(server.handle, 2)
    expected = {}
    for rid, s in stats.items():
        spec = s["spec"]
        expect = {("dspark:generation_tokens_total", ()): s["generation_tokens"],
                  ("dspark:prompt_tokens_total", ()): s["prompt_tokens"],
                  ("dspark:spec_decode_num_drafts_total", ()): spec["drafts"],
                  ("dspark:spec_decode_num_draft_tokens_total", ()): spec["draft_tokens"],
                  ("dspark:spec_decode_num_accepted_tokens_total", ()): spec["accepted_tokens"],
                  ("dspark:draft_fallbacks_total", ()): spec["fallbacks"]}
        for pos, v in enumerate(spec["accepted_per_pos"]):
            expect[("dspark:spec_decode_num_accepted_tokens_per_pos_total", (("position", str(pos)),))] = v
        for length, v in enumerate(spec["verify_length_hist"]):
            expect[("dspark:spec_decode_verify_length_total", (("length", str(length)),))] = v
        expected.update({(rid, *k): float(v) for k, v in expect.items()})
        assert sum(spec["accepted_per_pos"]) == spec["accepted_tokens"]

    def got(samples):
        return {key: value(samples, key[1], replica=key[0], **dict(key[2])) for key in expected}

    try:
        wait_metrics(server, lambda samples: got(samples) == expected, timeout=10)
    except AssertionError:
        assert got(scrape(server)) == expected
    assert sum(s["spec"]["drafts"] for s in stats.values()) == value(scrape(server),
                                                                       "dspark:spec_decode_num_drafts_total")


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
