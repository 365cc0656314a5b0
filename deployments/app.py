"""Application builders: `build_app(config)` from Python, `app_builder(args)` for Serve's CLI and config files.

    serve run configs/serve.yaml                      # or `serve deploy configs/serve.yaml` on a running cluster
    serve run deployments.app:app_builder engine.model=/path/to/hf-folder drafter_mode=none num_replicas=2
"""
from __future__ import annotations

from ray import serve
from ray.serve import Application

from deployments.config import LLMServingConfig
from deployments.ingress import OpenAIIngressDeployment
from deployments.metrics import MetricsHub
from deployments.server import LLMDeployment, OpenAIServerDeployment

MetricsHubDeployment = serve.deployment(MetricsHub, name="MetricsHub")


def build_app(config: LLMServingConfig | None = None) -> Application:
    """The LLM replicas (each with its own draft actor): `num_replicas` of them, or as many as
    `llm.autoscaling_config` decides, behind the OpenAI ingress deployment (ingress_mode 'separate') or serving the
    OpenAI routes themselves ('in_replica'); plus the metrics hub every replica pushes its samples to."""
    config = config or LLMServingConfig()
    hub = None
    if config.metrics.enabled:
        hub = MetricsHubDeployment.options(**config.metrics_hub_options()).bind(config.metrics.stale_after_s)
    if config.ingress_mode == "in_replica":
        return OpenAIServerDeployment.options(**config.llm_deployment_options()).bind(config, hub)
    llm = LLMDeployment.options(**config.llm_deployment_options()).bind(config, hub)
    return OpenAIIngressDeployment.options(**config.ingress_deployment_options()).bind(llm, config, hub)


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
