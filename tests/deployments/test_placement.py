"""Placement on a multi-node cluster: every LLM replica and its draft actor share a node and a (logical) GPU.

A local `ray.cluster_utils.Cluster`: a head without GPUs and two worker nodes declaring 2 logical GPUs each. Four
replicas each ask for half a GPU plus half a GPU for the draft actor, in one placement-group bundle {CPU: 2, GPU: 1},
so the four bundles fill the four GPUs. Node ids and ray.get_gpu_ids() are reported from inside the replica and
from inside its actor.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from deployments.config import DeploymentOptions, DraftActorOptions, LLMServingConfig
from deployments.launch import free_port, run_app
from engine import EngineConfig
from tests.helpers import make_tiny_model
from tests.helpers import make_tiny_drafter

ray = pytest.importorskip("ray")
httpx = pytest.importorskip("httpx")
pytestmark = pytest.mark.slow

REPLICAS = 4
MB = 2**20


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    os.environ["RAY_AUTH_MODE"] = "disabled"
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0, "object_store_memory": 100 * MB,
                                                       "include_dashboard": False})
    workers = [c.add_node(num_cpus=4, num_gpus=2, object_store_memory=100 * MB) for _ in range(2)]
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c, [w.node_id for w in workers]
    finally:
        from ray import serve

        serve.shutdown()
        ray.shutdown()
        c.shutdown()


def test_replicas_and_draft_actors_share_node_and_gpu(cluster, tmp_path_factory, default_tokenizer):
    from ray import serve

    _, worker_ids = cluster
    folder = tmp_path_factory.mktemp("placement")
    target = make_tiny_model("llama", folder / "target", default_tokenizer)
    drafter = make_tiny_drafter(folder / "drafter", len(default_tokenizer))
    config = LLMServingConfig(
        engine=EngineConfig(model=str(target), dtype="float32", device="cpu", kv_cache_memory_gb=0.02,
                            drafter=str(drafter), speculation="fixed:2", max_num_seqs=4, max_num_batched_tokens=64),
        served_model_name="tiny", num_replicas=REPLICAS,
        llm=DeploymentOptions(ray_actor_options={"num_cpus": 1, "num_gpus": 0.5}),
        draft_actor=DraftActorOptions(num_cpus=1, num_gpus=0.5))
    assert config.llm_deployment_options()["placement_group_bundles"] == [{"CPU": 2.0, "GPU": 1.0}]
    port = free_port()
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    app = run_app(config, port)

    handle = app.handle()
    seen: dict[str, dict] = {}
    deadline = time.monotonic() + 120
    while len(seen) < REPLICAS and time.monotonic() < deadline:  # the router picks replicas at random
        info = handle.placement.remote().result()
        seen[info["replica"]] = info
    assert len(seen) == REPLICAS, seen
    for info in seen.values():
        actor = info["draft_actor"]
        assert actor is not None and actor["pid"] != info["pid"]
        assert actor["node_id"] == info["node_id"] in worker_ids  # never the GPU-less head
        assert len(info["gpu_ids"]) == 1 and actor["gpu_ids"] == info["gpu_ids"]
    assert len({(i["node_id"], i["gpu_ids"][0]) for i in seen.values()}) == REPLICAS  # one GPU per replica
    assert {i["node_id"] for i in seen.values()} == set(worker_ids)

    # And the app answers over HTTP through this cluster, drafting on the co-located actors.
    r = httpx.post(f"{app.base}/v1/completions", timeout=60,
                   json={"prompt": "Hello", "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["metrics"]["speculative_decoding"]["num_spec_steps"] > 0

    serve.delete(app.name)  # frees the four GPUs for the tests below


def test_a_replica_holding_a_gpu_it_cannot_use_says_so(cluster):
    """In an actor holding a (logical) GPU, the check a replica runs first: with device auto or cuda on a node whose
    torch sees no CUDA it names the GPU and the way out; an explicit cpu is let through."""
    import torch

    from deployments.server import gpu_claim_error

    @ray.remote(num_gpus=1, num_cpus=0)
    def check(device: str):
        return ray.get_gpu_ids(), gpu_claim_error(ray.get_gpu_ids(), device, torch.cuda.is_available())

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the logical GPU may be a real one")
    for device in ("auto", "cuda"):
        gpu_ids, error = ray.get(check.remote(device))
        assert len(gpu_ids) == 1 and f"holds GPU {gpu_ids[0]}" in error and "CUDA is not available" in error
    assert ray.get(check.remote("cpu"))[1] is None
    assert "holds no GPU" in ray.get(ray.remote(num_cpus=0)(
        lambda: gpu_claim_error(ray.get_gpu_ids(), "cuda", torch.cuda.is_available())).remote())


def test_serve_fails_the_deployment_with_that_reason(cluster, tmp_path_factory, default_tokenizer):
    """configs/serve_gpu.yaml's resources on nodes whose torch has no CUDA: the replica stops in its constructor
    and Serve fails the deployment with the reason, instead of running the engine on CPU or restarting forever."""
    import torch
    import yaml
    from ray import serve

    from deployments.config import DeploymentOptions

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs" / "serve_gpu.yaml").read_text())
    gpu = LLMServingConfig.model_validate(raw["applications"][0]["args"])
    target = make_tiny_model("llama", tmp_path_factory.mktemp("gpu-claim") / "target", default_tokenizer)
    config = LLMServingConfig(
        engine=gpu.engine.model_copy(update={"model": str(target), "drafter": None, "device": "auto"}),
        drafter_mode="none", served_model_name="tiny", ingress_mode="in_replica",
        llm=DeploymentOptions(ray_actor_options={"num_cpus": 1, "num_gpus": 1}, max_constructor_retry_count=1))
    with pytest.raises(Exception, match="CUDA is not available"):
        run_app(config, free_port(), timeout_s=60)
