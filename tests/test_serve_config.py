"""Serving config and protocol, without a cluster: configs/serve.yaml, deployment options, request validation."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from deployments.config import DeploymentOptions, DraftActorOptions, LLMServingConfig
from deployments.openai_protocol import (ChatCompletionRequest, CompletionRequest, SpeculativeDecodingMetrics,
                                         validation_message)

SERVE_YAML = Path(__file__).resolve().parent.parent / "configs" / "serve.yaml"


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
                         ('{"prompt": "hi", "logit_bias": {"5": 1}}', "not supported"),
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
