"""The Grafana dashboard, and the queries a vLLM user's dashboards run (dashboards/vllm_queries.py), against a real
Prometheus: every query returns data.

A Prometheus server (the `prometheus` binary; `scripts/setup.sh --test` installs it) scrapes the app's /metrics on
loopback every second while a bounded loop of requests runs; then each query of dashboards/grafana_dspark.json
(`dashboards.queries.panel_queries()`, Grafana variables replaced), and each of vLLM's, goes through
Prometheus' HTTP API and must come back with at least one finite value. Skipped, with the reason, only when there is no prometheus binary.
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from deployments.launch import free_port, run_app

pytest.importorskip("ray")
httpx = pytest.importorskip("httpx")
PROMETHEUS = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None)
NO_PROMETHEUS = "no prometheus binary (apt-get install -y prometheus; scripts/setup.sh --test installs it)"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(PROMETHEUS is None, reason=NO_PROMETHEUS)]
SERVE_CLUSTER = dict(num_cpus=4, object_store_mb=100)  # tests/conftest.py's serve_port
LOAD_S = 15.0  # seconds of requests: well over a few scrapes, inside the dashboard's 1m rate window
MAX_REQUESTS = 400


def wait_for(fn, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = fn()
            if result:
                return result
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)


@pytest.fixture(scope="module")
def app(serve_port, tmp_path_factory, default_tokenizer):
    from deployments.config import LLMServingConfig
    from engine import EngineConfig
    from tests.helpers import make_tiny_model
    from tests.helpers import make_tiny_drafter

    folder = tmp_path_factory.mktemp("prom-app")
    target = make_tiny_model("llama", folder / "target", default_tokenizer)
    drafter = make_tiny_drafter(folder / "drafter", len(default_tokenizer))
    engine_cfg = EngineConfig(model=str(target), dtype="float32", device="cpu", kv_cache_memory_gb=0.02,
                              drafter=str(drafter), speculation="fixed:3", max_num_seqs=4,
                              max_num_batched_tokens=128)
    # One replica, drafter in-process: the cheapest app that speculates (the queries aggregate over replicas).
    config = LLMServingConfig(engine=engine_cfg, served_model_name="tiny", drafter_mode="in_process")
    return run_app(config, serve_port).base


@pytest.fixture(scope="module")
def prometheus(app, tmp_path_factory):
    folder = tmp_path_factory.mktemp("prometheus")
    target = app.removeprefix("http://")
    (folder / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: dspark\n"
        "    metrics_path: /metrics\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n")
    port = free_port()
    log = open(folder / "prometheus.log", "wb")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={folder / 'prometheus.yml'}",
                             f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.level=warn"], cwd=folder, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: proc.poll() is None and httpx.get(f"{base}/-/ready", timeout=2).status_code == 200, 60,
                 "Prometheus to start")

        def target_up():
            targets = httpx.get(f"{base}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
            return targets and all(t["health"] == "up" for t in targets)

        wait_for(target_up, 60, "Prometheus to scrape the app's /metrics")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def run_load(base: str) -> int:
    """Concurrent completions on loopback for LOAD_S seconds (at most MAX_REQUESTS); returns how many finished."""
    body = {"prompt": "The quick brown fox", "max_tokens": 32, "temperature": 0, "ignore_eos": True}
    deadline = time.monotonic() + LOAD_S
    counter = iter(range(MAX_REQUESTS))

    def worker(_):
        done = 0
        with httpx.Client(base_url=base, timeout=120) as client:
            while time.monotonic() < deadline and next(counter, None) is not None:
                r = client.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                done += 1
        return done

    with ThreadPoolExecutor(4) as pool:
        return sum(pool.map(worker, range(4)))


@pytest.fixture(scope="module")
def loaded(app, prometheus):
    """The requests that finished under load (the queries below read the window they fall in)."""
    finished = run_load(app)
    assert finished >= 8, finished
    time.sleep(3)  # a few scrapes after the last request
    return finished


def assert_queries_return_data(prometheus: str, queries: list[tuple[str, str]]) -> None:
    failures, empty = [], []
    for title, promql in queries:
        r = httpx.get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=30)
        body = r.json()
        if r.status_code != 200 or body.get("status") != "success":
            failures.append(f"{title}: {promql} -> {body.get('error', r.text)}")
        elif not any(math.isfinite(float(s["value"][1])) for s in body["data"]["result"]):
            empty.append(f"{title}: {promql} -> {body['data']['result']}")  # no series, or only NaN (0/0)
    assert not failures, "queries Prometheus rejected:\n" + "\n".join(failures)
    assert not empty, "queries without data:\n" + "\n".join(empty)


def test_every_dashboard_query_returns_data(prometheus, loaded):
    from dashboards.queries import panel_queries

    queries = panel_queries()
    assert len(queries) >= 15
    assert_queries_return_data(prometheus, queries)


def test_vllm_dashboard_queries_return_data(prometheus, loaded):
    """vLLM's names, labels (model_name) and histogram layouts, as a vLLM user's dashboard queries them."""
    from dashboards.vllm_queries import vllm_queries

    queries = vllm_queries(model_name="tiny")
    assert len(queries) >= 30
    assert_queries_return_data(prometheus, queries)
