"""Serving config and protocol, without a cluster: configs/serve.yaml, deployment options, request validation."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from deployments.config import DeploymentOptions, DraftActorOptions, LLMServingConfig
from deployments.openai_protocol import (ChatCompletionRequest, CompletionRequest, SpeculativeDecodingMetrics,
                                         validation_message)

SERVE_YAML = Path(__file__).resolve().parents[2] / "configs" / "serve.yaml"


def test_serve_yaml_is_a_valid_serve_config_and_builds_the_app():
    from ray.serve.schema import ServeDeploySchema

    from deployments.app import app_builder

    raw = yaml.safe_load(SERVE_YAML.read_text())
    ServeDeploySchema.model_validate(raw)
    app = raw["applications"][0]
    assert app["import_path"] == "deployments.app:app_builder"
    config = LLMServingConfig.model_validate(app["args"])
    assert config.engine.drafter == "default" and config.drafter_mode == "actor"
    assert app_builder(app["args"]) is not None
    # `serve run deployments.app:app_builder engine.model=... num_replicas=2` passes dotted string keys.
    assert app_builder({"engine.dtype": "float32", "num_replicas": "2", "drafter_mode": "none"}) is not None


def test_one_bundle_per_replica_holds_the_replica_and_its_draft_actor():
    gpu = LLMServingConfig(llm=DeploymentOptions(ray_actor_options={"num_cpus": 1, "num_gpus": 0.5}),
                           draft_actor=DraftActorOptions(num_cpus=1, num_gpus=0.5), num_replicas=3)
    opts = gpu.llm_deployment_options()
    assert opts["placement_group_bundles"] == [{"CPU": 2.0, "GPU": 1.0}]
    assert opts["placement_group_strategy"] == "STRICT_PACK" and opts["num_replicas"] == 3
    none = LLMServingConfig(drafter_mode="none").llm_deployment_options()
    assert "placement_group_bundles" not in none  # no actor, no group needed
    with pytest.raises(ValidationError, match="must hold the replica and its draft actor"):
        LLMServingConfig(placement_group_bundles=[{"CPU": 1}])
    with pytest.raises(ValidationError):
        LLMServingConfig(drafter_mode="sidecar")


def test_request_validation():
    ok = CompletionRequest.model_validate_json('{"prompt": "hi", "speculation": "fixed:3", "whatever": 1}')
    assert ok.speculation == "fixed:3" and ok.temperature == 1.0  # unknown fields ignored; OpenAI's default
    assert CompletionRequest.model_validate_json('{"prompt": [[1, 2], [3]]}').prompts() == [[1, 2], [3]]
    chat = ChatCompletionRequest.model_validate_json(
        '{"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, '
        '{"type": "text", "text": "b"}]}], "max_completion_tokens": 5, "max_tokens": 9}')
    assert chat.messages[0].as_template_dict() == {"role": "system", "content": "a\nb"}
    assert chat.requested_max_tokens() == 5
    for body, needle in [('{"prompt": "hi", "temperature": NaN}', "finite"),
                         ('{"prompt": "hi", "max_tokens": "5"}', "max_tokens"),
                         ('{"prompt": "hi", "speculation": "fast"}', "invalid speculation"),
                         ('{"prompt": "hi", "logit_bias": {"x5": 1}}', "token ids"),
                         ('{"prompt": "hi", "frequency_penalty": -3}', "frequency_penalty"),
                         ('{"prompt": 1.5}', "prompt")]:
        with pytest.raises(ValidationError) as exc:
            CompletionRequest.model_validate_json(body)
        assert needle in validation_message(exc.value)


def test_spec_metrics_totals():
    m = SpeculativeDecodingMetrics.total([
        {"num_spec_steps": 4, "num_draft_tokens": 12, "num_accepted_tokens": 6},
        {"num_spec_steps": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}, {}])
    assert (m.num_spec_steps, m.mean_acceptance_length, m.acceptance_rate) == (4, 2.5, 0.5)
    assert SpeculativeDecodingMetrics.total([{}]).mean_acceptance_length == 1.0


def test_serve_autoscale_yaml_enables_the_dspark_policy():
    from ray.serve.config import AutoscalingConfig
    from ray.serve.schema import ServeDeploySchema

    from autoscale.policy import DSparkPolicy
    from deployments.app import app_builder

    raw = yaml.safe_load((SERVE_YAML.parent / "serve_autoscale.yaml").read_text())
    ServeDeploySchema.model_validate(raw)
    args = raw["applications"][0]["args"]
    assert "num_replicas" not in args
    config = LLMServingConfig.model_validate(args)
    opts = config.llm_deployment_options()
    assert "num_replicas" not in opts
    auto = opts["autoscaling_config"]
    assert auto["upscale_delay_s"] == auto["downscale_delay_s"] == 0
    assert auto["policy"]["policy_function"] == "autoscale.policy:DSparkPolicy"
    kwargs = auto["policy"]["policy_kwargs"]
    assert kwargs["max_num_seqs"] == config.engine.max_num_seqs  # the engine's limits, filled in
    assert kwargs["token_budget"] == config.engine.max_num_batched_tokens
    assert DSparkPolicy(**kwargs).params.queue_up == 4.0
    AutoscalingConfig(**auto)
    assert app_builder(args) is not None
    # The fixed-count config stays fixed.
    fixed = LLMServingConfig.model_validate(yaml.safe_load(SERVE_YAML.read_text())["applications"][0]["args"])
    assert fixed.llm.autoscaling_config is None and fixed.llm_deployment_options()["num_replicas"] == 1


def test_autoscaling_config_is_checked():
    policy = {"policy_function": "autoscale.policy:DSparkPolicy", "policy_kwargs": {"queue_up": 2.0}}
    auto = {"min_replicas": 1, "max_replicas": 4, "policy": policy}
    with pytest.raises(ValidationError, match="exclude each other"):
        LLMServingConfig(num_replicas=2, llm=DeploymentOptions(autoscaling_config=auto))
    with pytest.raises(ValidationError, match="must be 0"):
        DeploymentOptions(autoscaling_config={**auto, "upscale_delay_s": 30})
    with pytest.raises(ValidationError, match="queue_up"):  # PolicyParams' own checks, at config time
        DeploymentOptions(autoscaling_config={**auto, "policy": {**policy, "policy_kwargs": {"queue_up": -1}}})
    with pytest.raises(ValidationError):
        DeploymentOptions(autoscaling_config={**auto, "policy": {**policy, "policy_kwargs": {"nope": 1}}})
    with pytest.raises(ValidationError):  # Serve's own validation
        DeploymentOptions(autoscaling_config={"min_replicas": 3, "max_replicas": 2})
    # Another policy (Serve's default) keeps whatever delays it is given; kwargs are not touched.
    opts = LLMServingConfig(llm=DeploymentOptions(autoscaling_config={"min_replicas": 1, "max_replicas": 3,
                                                                      "upscale_delay_s": 5})).llm_deployment_options()
    assert opts["autoscaling_config"]["upscale_delay_s"] == 5 and "num_replicas" not in opts


def test_ingress_options_only_with_the_separate_ingress():
    assert LLMServingConfig().ingress_mode == "separate"
    LLMServingConfig(ingress_mode="in_replica", num_replicas=2)
    with pytest.raises(ValidationError, match="in_replica"):
        LLMServingConfig(ingress_mode="in_replica", ingress_replicas=2)
    with pytest.raises(ValidationError):
        LLMServingConfig(ingress_mode="nowhere")


def serve_args(*flags: str):
    from deployments.cli import build_parser

    return build_parser().parse_args(["serve", *flags])


def test_dspark_serve_gives_one_replica_every_core_and_shares_them_with_its_draft_actor(monkeypatch):
    import os

    from deployments.cli import serving_config

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    one = serving_config(serve_args())
    assert one.torch_threads == 8 and one.draft_actor.num_threads == 8 and one.draft_actor.num_cpus == 0
    assert one.replica_bundle() == {"CPU": 8.0}  # the actor reserves no core of its own
    assert one.llm.max_queued_requests == LLMServingConfig().llm.max_queued_requests
    two = serving_config(serve_args("--replicas", "2"))
    assert two.torch_threads == 4 and two.replica_bundle() == {"CPU": 4.0}
    assert serving_config(serve_args("--replicas", "3", "--torch-threads", "2")).torch_threads == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert serving_config(serve_args("--replicas", "4")).torch_threads == 1


def test_dspark_serve_deterministic_reaches_the_engine_config():
    from deployments.cli import serving_config

    assert serving_config(serve_args("--deterministic")).engine.deterministic is True
    assert serving_config(serve_args("--no-deterministic")).engine.deterministic is False
    assert serving_config(serve_args()).engine.deterministic is None  # on wherever the CPU kernels run


def test_dspark_serve_num_gpus_puts_the_replica_and_its_draft_actor_on_one_gpu(monkeypatch):
    import os

    from deployments.cli import serving_config

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    config = serving_config(serve_args("--num-gpus", "1"))
    assert config.llm.ray_actor_options == {"num_cpus": 4, "num_gpus": 0.5} and config.draft_actor.num_gpus == 0.5
    assert config.llm_deployment_options()["placement_group_bundles"] == [{"CPU": 4.0, "GPU": 1.0}]
    inproc = serving_config(serve_args("--num-gpus", "1", "--drafter-mode", "in_process"))
    assert inproc.llm.ray_actor_options["num_gpus"] == 1 and inproc.draft_actor.num_gpus == 0
    cluster = serving_config(serve_args("--num-gpus", "2", "--address", "auto"))  # the config's CPUs, our GPUs
    assert cluster.replica_bundle() == {"CPU": 2.0, "GPU": 2.0}
    assert cluster.llm.max_queued_requests == LLMServingConfig().llm.max_queued_requests
    assert serving_config(serve_args()).replica_bundle() == {"CPU": 4.0}  # no GPU unless asked


def test_serve_gpu_yaml_claims_one_gpu_per_replica_for_it_and_its_draft_actor():
    from ray.serve.schema import ServeDeploySchema

    from deployments.app import app_builder

    raw = yaml.safe_load((SERVE_YAML.parent / "serve_gpu.yaml").read_text())
    ServeDeploySchema.model_validate(raw)
    args = raw["applications"][0]["args"]
    config = LLMServingConfig.model_validate(args)
    assert config.engine.device == "cuda" and config.engine.dtype == "auto" and config.drafter_mode == "actor"
    options = config.llm_deployment_options()
    assert options["placement_group_bundles"] == [{"CPU": 5.0, "GPU": 1.0}]
    assert options["autoscaling_config"]["policy"]["policy_function"] == "autoscale.policy:DSparkPolicy"
    assert app_builder(args) is not None


def test_gpu_claim_errors():
    from deployments.server import gpu_claim_error

    assert gpu_claim_error([], "auto", False) is None  # a CPU replica
    assert gpu_claim_error(["0"], "auto", True) is None and gpu_claim_error(["0"], "cuda", True) is None
    assert gpu_claim_error(["3"], "cpu", False) is None  # the operator's choice
    for device in ("auto", "cuda", "cuda:0"):
        assert "holds GPU 3 but CUDA is not available" in gpu_claim_error(["3"], device, False)
    assert "holds no GPU" in gpu_claim_error([], "cuda", False)




def test_the_http_front_is_chosen_by_the_environment_ray_starts_with(monkeypatch):
    """haproxy: Serve's HAProxy ingress, with its files and ports of its own (two servers on one machine would share
    Ray's defaults) and a short drain; ray: Serve's Python proxy; the environment is put back afterwards."""
    from deployments.launch import haproxy_binary, http_proxy_env, serve_environment

    assert http_proxy_env("ray") == {"RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"}
    env = http_proxy_env("haproxy", "/tmp/dsh-x", drain_s=2.0)
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1" and env["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] == "2.0"
    assert env["RAY_SERVE_HAPROXY_SOCKET_PATH"].startswith("/tmp/dsh-x/")
    assert env["RAY_SERVE_HAPROXY_STATS_PORT"] not in ("8404", env["RAY_SERVE_HAPROXY_METRICS_PORT"])
    with pytest.raises(ValueError, match="haproxy"):
        http_proxy_env("nginx")
    assert haproxy_binary() is not None  # ray[serve] installs one on Linux

    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "0")
    with serve_environment("haproxy") as env:
        run_dir = Path(env["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"]).parent
        assert run_dir.is_dir() and os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "0" and not run_dir.exists()
