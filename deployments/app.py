"""Application builders: `build_app(config)` from Python, `app_builder(args)` for Serve's CLI and config files.

    serve run configs/serve.yaml                      # or `serve deploy configs/serve.yaml` on a running cluster
    serve run deployments.app:app_builder engine.model=/path/to/hf-folder drafter_mode=none num_replicas=2
"""
from __future__ import annotations

from ray.serve import Application

from deployments.config import LLMServingConfig
from deployments.ingress import OpenAIIngressDeployment
from deployments.server import LLMDeployment


def build_app(config: LLMServingConfig | None = None) -> Application:
    """The OpenAI ingress in front of `num_replicas` LLM replicas (each with its own draft actor)."""
    config = config or LLMServingConfig()
    llm = LLMDeployment.options(**config.llm_deployment_options()).bind(config)
    return OpenAIIngressDeployment.options(**config.ingress_deployment_options()).bind(llm, config)


def app_builder(args: dict) -> Application:
    """`args` is an LLMServingConfig as a dict (a YAML `args:` block); dotted keys from `serve run ... a.b=v`
    address nested fields."""
    nested: dict = {}
    for key, value in (args or {}).items():
        *parents, leaf = str(key).split(".")
        node = nested
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = None if value in ("null", "None") else value
    return build_app(LLMServingConfig.model_validate(nested))
