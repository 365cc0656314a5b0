"""End to end on a local Ray: DSparkPolicy scales the LLM deployment from 1 to 2 replicas under load and back to 1.

The app has tiny replicas (a tiny random target, no drafter, two sequence slots) and autoscaling through
`autoscale.policy:DSparkPolicy` with short delays and cooldowns in policy_kwargs. Six concurrent long completions on
loopback keep about four requests waiting for admission on the one replica, so the engine's load signal
(queue_depth, published by `LLMServer.record_autoscaling_stats`) crosses `queue_up`; the policy asks for a second
replica, and once the load stops and the signals decay, it scales back to one. The replica count is read from
Serve's status API; the controller's log shows that the decisions were the dspark policy's.
"""
from __future__ import annotations

import glob
import os
import threading
import time

import pytest

from deployments.launch import run_app

ray = pytest.importorskip("ray")
httpx = pytest.importorskip("httpx")
pytestmark = pytest.mark.slow
SERVE_CLUSTER = dict(num_cpus=4, object_store_mb=100)  # tests/conftest.py's serve_port

MAX_REQUESTS = 60  # the load is bounded: at most this many requests, and only until the scale-up is seen
CONCURRENCY = 6
POLICY_KWARGS = dict(queue_up=1.0, upscale_delay_s=1.0, up_cooldown_s=2.0, drain_horizon_s=0.0, trend_s=1.0,
                     downscale_delay_s=3.0, down_cooldown_s=2.0, start_timeout_s=120.0)


def running_replicas(app: str) -> int:
    from ray import serve
    from ray.serve._private.common import ReplicaState

    dep = serve.status().applications[app].deployments["LLMServer"]
    return dep.replica_states.get(ReplicaState.RUNNING, 0)


def wait_replicas(app: str, want, timeout: float) -> tuple[int, float]:
    t0 = time.monotonic()
    while True:
        n = running_replicas(app)
        if want(n):
            return n, time.monotonic() - t0
        assert time.monotonic() - t0 < timeout, f"LLMServer has {n} running replicas after {timeout} s"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def app(serve_port, tmp_path_factory, default_tokenizer):
    from deployments.config import DeploymentOptions, LLMServingConfig
    from engine import EngineConfig
    from tests.helpers import make_tiny_model

    target = make_tiny_model("llama", tmp_path_factory.mktemp("autoscale") / "target", default_tokenizer)
    autoscaling = {"min_replicas": 1, "max_replicas": 2, "initial_replicas": 1,
                   "metrics_interval_s": 0.5, "look_back_period_s": 2.0,
                   "policy": {"policy_function": "autoscale.policy:DSparkPolicy", "policy_kwargs": POLICY_KWARGS}}
    config = LLMServingConfig(
        engine=EngineConfig(model=str(target), dtype="float32", device="cpu", kv_cache_memory_gb=0.02,
                            drafter=None, max_num_seqs=2, max_num_batched_tokens=64),
        served_model_name="tiny", drafter_mode="none",
        llm=DeploymentOptions(ray_actor_options={"num_cpus": 1}, autoscaling_config=autoscaling))
    options = config.llm_deployment_options()
    assert "num_replicas" not in options
    assert options["autoscaling_config"]["upscale_delay_s"] == options["autoscaling_config"]["downscale_delay_s"] == 0
    assert options["autoscaling_config"]["policy"]["policy_kwargs"]["max_num_seqs"] == 2  # from the engine
    app = run_app(config, serve_port)
    return app.name, app.base


def test_load_scales_up_and_idle_scales_back_down(app):
    name, base = app
    assert running_replicas(name) == 1
    stop = threading.Event()
    sent, errors = [], []
    lock = threading.Lock()
    body = {"prompt": "Tell me a long story", "max_tokens": 600, "ignore_eos": True, "temperature": 0}

    def worker():
        with httpx.Client(base_url=base, timeout=300) as client:
            while not stop.is_set():
                with lock:
                    if len(sent) >= MAX_REQUESTS:
                        return
                    sent.append(1)
                r = client.post("/v1/completions", json=body)
                if r.status_code != 200:
                    errors.append(r.text)

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(CONCURRENCY)]
    for t in threads:
        t.start()
    try:
        up, t_up = wait_replicas(name, lambda n: n >= 2, timeout=120)
    finally:
        stop.set()  # workers finish their current request and stop
        for t in threads:
            t.join(timeout=300)
    assert not errors, errors[:3]
    assert up == 2
    t_load = time.monotonic() - t0
    down, t_down = wait_replicas(name, lambda n: n == 1, timeout=90)
    print(f"1 -> 2 replicas after {t_up:.1f} s of load ({len(sent)} requests, load ended at {t_load:.1f} s); "
          f"back to 1 {t_down:.1f} s after the load")

    # The decisions were DSparkPolicy's (it logs each change in the controller), not Serve's request-based default.
    logs_dir = ray._private.worker._global_node.get_logs_dir_path()
    text = "".join(open(p, errors="replace").read() for p in glob.glob(os.path.join(logs_dir, "serve", "controller_*")))
    assert "dspark policy: 1 -> 2 replicas (up:queue" in text
    assert "dspark policy: 2 -> 1 replicas (down:idle" in text
