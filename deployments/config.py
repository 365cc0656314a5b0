"""The serving config: engine, drafter placement, replicas, request limits and the Serve deployment options.

Everything a deployment needs lives here (pydantic), so `configs/serve.yaml` can carry it unchanged as the
application's `args` and code never hard-codes resources.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autoscale.policy import PolicyParams
from engine.config import EngineConfig

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DSPARK_POLICY_MODULE = "autoscale.policy"
DSPARK_POLICY_CLASS = DSPARK_POLICY_MODULE + ":DSparkPolicy"  # Ray passes policy_kwargs only to a class


class RequestLimits(BaseModel):
    """Per-request limits checked by the ingress before anything reaches an engine (violations are HTTP 4xx)."""

    model_config = ConfigDict(extra="forbid")

    max_body_bytes: int = Field(1 << 20, ge=1024, description="larger request bodies get 413")
    max_prompt_tokens: int | None = Field(None, ge=1, description="default: the engine's max_model_len - 1")
    max_tokens: int = Field(8192, ge=1, description="largest max_tokens a request may ask for")
    default_chat_max_tokens: int = Field(
        2048, ge=1, description="chat without max_tokens: this, capped by the room left in the context")
    default_completion_max_tokens: int = Field(16, ge=1, description="completions without max_tokens (OpenAI: 16)")
    max_n: int = Field(8, ge=1, description="largest n (choices per prompt)")
    max_choices: int = Field(32, ge=1, description="largest (number of prompts) x n in one request")
    max_stop: int = Field(16, ge=0, description="most stop strings per request")
    max_stop_chars: int = Field(256, ge=1, description="longest stop string")
    max_stop_token_ids: int = Field(256, ge=0, description="most stop_token_ids per request")
    max_messages: int = Field(512, ge=1, description="most chat messages per request")
    max_logprobs: int = Field(20, ge=0, le=64, description="largest logprobs / top_logprobs")


class RateLimitOptions(BaseModel):
    """A token bucket per client, checked by the ingress before a completion request is read: `requests_per_s`
    sustained, `burst` at once; a client over its rate gets 429 with a Retry-After header (seconds). Off by default.
    Each replica serving HTTP keeps its own buckets, so with N of them a client may get up to N times the rate."""

    model_config = ConfigDict(extra="forbid")

    requests_per_s: float | None = Field(None, gt=0, description="sustained requests/s per client; None: no limit")
    burst: int = Field(32, ge=1, description="requests a client may send at once (the bucket's size)")
    key: Literal["ip", "api_key"] = Field(
        "ip", description="ip: the client's address; api_key: the `Authorization: Bearer` token (the address when "
                          "absent). This server does not check keys, so use api_key only behind a gateway that does")
    trust_forwarded_for: bool = Field(
        False, description="take the client address from X-Forwarded-For (only behind a proxy that sets it)")
    max_clients: int = Field(100_000, ge=1, description="buckets kept; the least recently seen client is dropped")

    @property
    def enabled(self) -> bool:
        return self.requests_per_s is not None


class DraftActorOptions(BaseModel):
    """The draft actor of each replica (drafter_mode 'actor'). It is placed in the replica's own placement-group
    bundle, so with GPUs give the replica and the actor fractions of one GPU (e.g. 0.5 each)."""

    model_config = ConfigDict(extra="forbid")

    num_cpus: float = Field(1, ge=0)
    num_gpus: float = Field(0, ge=0)
    max_restarts: int = Field(-1, ge=-1, description="-1: restart forever; contexts are rebuilt from the taps")
    step_timeout_s: float = Field(30, gt=0, description="a draft round slower than this counts as a failure")
    startup_timeout_s: float = Field(600, gt=0)
    num_threads: int | None = Field(None, ge=1, description="torch threads; default: num_cpus (at least 1)")


class DeploymentOptions(BaseModel):
    """Serve options of one deployment (passed to `Deployment.options`)."""

    model_config = ConfigDict(extra="forbid")

    ray_actor_options: dict = Field(default_factory=lambda: {"num_cpus": 1})
    max_ongoing_requests: int = Field(256, ge=1)
    max_queued_requests: int = Field(-1, ge=-1, description="per caller; beyond it: HTTP 503. -1: unbounded")
    health_check_period_s: float | None = None
    health_check_timeout_s: float | None = None
    graceful_shutdown_timeout_s: float | None = None
    max_constructor_retry_count: int | None = Field(
        None, ge=1, description="Serve's: how often a replica that fails to start is retried before the deployment "
                                "is failed (Serve's default 20)")
    autoscaling_config: dict | None = Field(
        None, description="Serve's autoscaling_config (then num_replicas is not passed). With the dspark policy "
                          "(policy.policy_function autoscale.policy:DSparkPolicy) Serve's upscale/downscale delays "
                          "default to 0 and must stay 0: the policy has its own")

    @field_validator("autoscaling_config")
    @classmethod
    def _check_autoscaling(cls, v: dict | None) -> dict | None:
        if v is None:
            return v
        v = dict(v)
        policy = v.get("policy") or {}
        function = policy.get("policy_function", "") if isinstance(policy, dict) else ""
        if isinstance(function, str) and function.startswith(DSPARK_POLICY_MODULE + ":"):
            for key in ("upscale_delay_s", "downscale_delay_s"):
                if v.setdefault(key, 0) != 0:
                    raise ValueError(f"autoscaling_config.{key} must be 0 with {function}: the policy has its own "
                                     f"delays (policy_kwargs), and Serve's would add to them")
            if function == DSPARK_POLICY_CLASS:
                try:  # unknown or inconsistent kwargs fail here, not in Serve's controller
                    PolicyParams(**(policy.get("policy_kwargs") or {}))
                except TypeError as exc:
                    raise ValueError(f"policy_kwargs: {exc}") from None
        from ray.serve.config import AutoscalingConfig

        AutoscalingConfig(**v)  # Serve's own validation, at config time rather than at deploy time
        return v

    def serve_options(self) -> dict:
        return self.model_dump(exclude_none=True)


class MetricsOptions(BaseModel):
    """Prometheus metrics at the ingress's /metrics: every replica pushes its samples to a MetricsHub deployment of
    the app (deployments/metrics.py)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    push_interval_s: float = Field(1.0, gt=0, description="how often each replica pushes its snapshot")
    stale_after_s: float = Field(10.0, gt=0, description="a replica silent this long is dropped from /metrics")
    ray_metrics: bool = Field(True, description="also export key gauges through Ray's metrics agent")


class LLMServingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    engine: EngineConfig = Field(default_factory=lambda: EngineConfig(drafter="default"))
    served_model_name: str | None = Field(
        None, description="the `model` clients send; default: SmolLM2-135M-Instruct or engine.model as given")
    drafter_mode: Literal["actor", "in_process", "none"] = Field(
        "actor", description="actor: a co-located Ray actor per replica; in_process: inside the engine; none: off")
    num_replicas: int = Field(1, ge=1, description="fixed replica count; not with llm.autoscaling_config")
    limits: RequestLimits = Field(default_factory=RequestLimits)
    rate_limit: RateLimitOptions = Field(default_factory=RateLimitOptions)
    torch_threads: int | None = Field(
        None, ge=1, description="engine threads per replica; default: its num_cpus. An engine whose threads fill "
        "every core the replica may use keeps nice 0 whatever engine_thread_nice says")
    engine_process: bool = Field(
        True, description="run each replica's engine in a child process of its own (as vLLM v1's EngineCore), so "
        "that the replica's event loops, which run Python for every request and streamed delta, never hold the "
        "engine's GIL; False: an engine thread in the replica's process")
    engine_thread_nice: int | None = Field(
        -10, ge=-20, le=19, description="nice value of each replica's engine (process or thread): below 0 (needs CAP_SYS_NICE; "
        "without it the thread keeps its priority) the proxy, event loops and other processes preempt the engine "
        "less. None: leave it")
    stream_interval_ms: float = Field(
        100.0, ge=0, le=1000, description="a streamed request's deltas are sent at most this often (merged in "
        "between; the first and the last at once). Each delta is a message per hop (replica -> proxy, and "
        "-> ingress with ingress_mode 'separate'), and that work takes CPU from the engine. 0: one message per "
        "engine step")
    stream_max_deltas_per_s: float | None = Field(
        160.0, gt=0, description="under load the stream interval stretches so that all of a replica's streams "
        "together send at most this many deltas a second (each carries more tokens; tokens/s do not change). "
        "None: stream_interval_ms only")
    # Serve deployment options.
    llm: DeploymentOptions = Field(default_factory=lambda: DeploymentOptions(max_queued_requests=1024))
    draft_actor: DraftActorOptions = Field(default_factory=DraftActorOptions)
    placement_group_bundles: list[dict[str, float]] | None = Field(
        None, description="per replica; default (actor mode): one bundle holding the replica and its draft actor")
    placement_group_strategy: Literal["PACK", "STRICT_PACK", "SPREAD", "STRICT_SPREAD"] = "STRICT_PACK"
    ingress_mode: Literal["separate", "in_replica"] = Field(
        "separate", description="separate: an OpenAI ingress deployment (`ingress`, `ingress_replicas`) in front of "
        "the LLM replicas; a replica that dies leaves its in-flight requests an OpenAI error (503, or an error "
        "event in a stream). in_replica: every LLM replica serves the OpenAI routes itself and Serve's proxy routes "
        "to it directly: a hop per streamed delta and a process fewer, but a replica that dies takes its HTTP "
        "connections with it (a cut stream, or the proxy's plain 500)")
    ingress: DeploymentOptions = Field(default_factory=lambda: DeploymentOptions(
        ray_actor_options={"num_cpus": 0}, max_ongoing_requests=4096))
    ingress_replicas: int = Field(1, ge=1)
    metrics: MetricsOptions = Field(default_factory=MetricsOptions)

    @model_validator(mode="after")
    def _check(self) -> LLMServingConfig:
        if self.drafter_mode == "actor" and self.placement_group_bundles is not None:
            first = self.placement_group_bundles[0] if self.placement_group_bundles else {}
            need = self.replica_bundle()
            short = {k: v for k, v in need.items() if first.get(k, 0) + 1e-9 < v}
            if short:
                raise ValueError(f"placement_group_bundles[0] must hold the replica and its draft actor: needs {need}")
        if self.ingress_mode == "in_replica" and {"ingress", "ingress_replicas"} & self.model_fields_set:
            raise ValueError("ingress and ingress_replicas configure the separate ingress deployment; with "
                             "ingress_mode 'in_replica' the LLM replicas serve HTTP (configure them under `llm`)")
        if self.llm.autoscaling_config is not None and "num_replicas" in self.model_fields_set:
            raise ValueError("num_replicas and llm.autoscaling_config exclude each other: with autoscaling, set "
                             "min_replicas / max_replicas / initial_replicas in autoscaling_config")
        return self

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.engine.model or DEFAULT_MODEL_NAME

    @property
    def uses_draft_actor(self) -> bool:
        return self.drafter_mode == "actor" and self.engine.drafter not in (None, "none")

    def replica_bundle(self) -> dict[str, float]:
        """Bundle 0: the replica's resources plus its draft actor's, so both land on one node (and one GPU)."""
        opts = self.llm.ray_actor_options
        cpus = float(opts.get("num_cpus", 1)) + self.draft_actor.num_cpus
        gpus = float(opts.get("num_gpus", 0)) + self.draft_actor.num_gpus
        bundle = {"CPU": cpus}
        if gpus:
            bundle["GPU"] = gpus
        for name, amount in (opts.get("resources") or {}).items():
            bundle[name] = float(amount)
        return bundle

    def llm_deployment_options(self) -> dict:
        """Options for `LLMDeployment.options`: a fixed num_replicas, or llm.autoscaling_config. For the dspark
        policy, policy_kwargs max_num_seqs and token_budget default to this engine's limits."""
        options = self.llm.serve_options()
        auto = options.get("autoscaling_config")
        if auto is None:
            options["num_replicas"] = self.num_replicas
        elif (auto.get("policy") or {}).get("policy_function") == DSPARK_POLICY_CLASS:
            policy = dict(auto["policy"])
            kwargs = dict(policy.get("policy_kwargs") or {})
            kwargs.setdefault("max_num_seqs", self.engine.max_num_seqs)
            kwargs.setdefault("token_budget", self.engine.max_num_batched_tokens)
            options["autoscaling_config"] = {**auto, "policy": {**policy, "policy_kwargs": kwargs}}
        if self.uses_draft_actor:
            options["placement_group_bundles"] = self.placement_group_bundles or [self.replica_bundle()]
            options["placement_group_strategy"] = self.placement_group_strategy
        elif self.placement_group_bundles:
            options["placement_group_bundles"] = self.placement_group_bundles
            options["placement_group_strategy"] = self.placement_group_strategy
        return options

    def ingress_deployment_options(self) -> dict:
        options = self.ingress.serve_options()
        if "autoscaling_config" not in options:
            options["num_replicas"] = self.ingress_replicas
        return options

    def metrics_hub_options(self) -> dict:
        return {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}, "max_ongoing_requests": 4096}
