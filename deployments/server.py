"""The LLM deployment: one replica = one AsyncLLMEngine + its co-located draft actor. With ingress_mode 'separate'
(the default) an ingress deployment in front calls it through a handle (LLMServer); with 'in_replica' each replica
serves the OpenAI routes itself (OpenAIServer).

Serve creates each replica inside its own placement group (LLMServingConfig.llm_deployment_options); the replica
creates its draft actor in bundle 0 of that group, so the actor lands on the replica's node and, with fractional
num_gpus, on the replica's GPU. The actor is owned by the replica and dies with it.

Each replica also publishes its engine's load signals to Serve's autoscaler (`record_autoscaling_stats`) and pushes
its Prometheus samples to the app's metrics hub once a second (deployments/metrics.py).

Methods return plain dicts (token ids, text deltas, metrics): the ingress turns them into OpenAI JSON. Errors come
back as `{"error": message, "status": http_status}` items rather than exceptions, so they cross Ray intact.
"""
from __future__ import annotations

import functools
import logging
import math
import os
import uuid
from collections.abc import AsyncIterator

import ray
import torch
from ray import serve

from deployments.config import LLMServingConfig
from deployments.ingress import OpenAIIngress
from deployments.metrics import (MetricsPusher, RayGauges, ReplicaMetrics,
                                 process_rss_bytes)
from draft_service.actor import DraftServiceProxy, RayLocator, draft_context_tokens, start_draft_actor
from engine.async_engine import (AsyncLLMEngine, EngineDeadError, EngineStepError, RequestAbortedError,
                                 engine_info, stream_interval_s)
from engine.engine_process import EngineProcess
from engine.llm_engine import LLMEngine, QueueFullError, RequestOutput
from engine.loader import resolve_device, resolve_drafter, resolve_dtype, resolve_model
from engine.sampling_params import SamplingParams

log = logging.getLogger("ray.serve")


def _error(exc: BaseException) -> dict:
    if isinstance(exc, QueueFullError):
        return {"error": str(exc), "status": 429}
    if isinstance(exc, (ValueError, TypeError)):
        return {"error": str(exc), "status": 400}
    if isinstance(exc, EngineDeadError):
        return {"error": f"this replica's engine is not running: {exc}", "status": 503}
    if isinstance(exc, (EngineStepError, RequestAbortedError)):
        return {"error": str(exc), "status": 500}
    return {"error": f"internal error: {exc!r}", "status": 500}


def _delta(out: RequestOutput) -> dict:
    """One RequestOutput delta as plain data: only what is new, plus the totals the ingress reports."""
    d = {"text": out.new_text, "token_ids": out.new_token_ids, "finished": out.finished,
         "finish_reason": out.finish_reason, "num_prompt_tokens": len(out.prompt_token_ids),
         "num_output_tokens": len(out.token_ids)}
    if out.logprobs is not None:
        end = len(out.token_ids)
        start = end - len(out.new_token_ids)
        # per new token: (token id, {token id: logprob} of the top ones and the chosen one)
        d["logprobs"] = list(zip(out.new_token_ids, out.logprobs[start:end]))
    if out.finished:
        d["metrics"] = out.metrics
    return d


def gpu_claim_error(gpu_ids: list, device: str, cuda_available: bool) -> str | None:
    """Why a replica holding `gpu_ids` (ray.get_gpu_ids()) cannot run its engine on `device` ('auto', 'cpu',
    'cuda[:n]'), or None. A replica given a GPU it cannot use would otherwise run on CPU unnoticed (auto) or fail
    deep in the engine, restart and fail again (cuda). An explicit 'cpu' is the operator's choice (and what tests
    with logical GPUs use)."""
    if device == "cpu":
        return None
    if gpu_ids and not cuda_available:
        return (f"this replica holds GPU {', '.join(map(str, gpu_ids))} but CUDA is not available in its process "
                f"(torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none'}): install a CUDA build "
                f"of torch on this node, or give the replica no GPU (llm.ray_actor_options.num_gpus: 0) or "
                f"engine.device: cpu")
    if not gpu_ids and device != "auto" and not cuda_available:
        return (f"engine.device is {device!r} but this replica holds no GPU, and Ray hides every GPU from a replica "
                f"that holds none: give it one (llm.ray_actor_options.num_gpus, or `dspark serve --num-gpus`)")
    return None


class LLMServer:
    def __init__(self, config: LLMServingConfig, metrics_hub=None):
        """`metrics_hub`: a handle to the app's MetricsHub deployment (None: no pushing; see deployments/metrics.py)."""
        gpu_ids = ray.get_gpu_ids()
        error = gpu_claim_error(gpu_ids, str(config.engine.device), torch.cuda.is_available())
        if error:
            raise RuntimeError(error)  # before anything starts: Serve reports it as the deployment's failure
        if gpu_ids and str(config.engine.device) == "cpu":
            log.warning("this replica holds GPU %s but engine.device is cpu: the GPU stays idle", gpu_ids)
        self.config = config
        self.pusher = None
        threads = config.torch_threads or _assigned_cpus()
        torch.set_num_threads(threads)  # Ray's OMP default may come after torch is imported
        nice = config.engine_thread_nice
        if nice is not None and nice < 0 and threads >= len(os.sched_getaffinity(0)):
            # An engine whose threads fill every core, at a higher priority, starves the proxy and the event loops
            # that admit requests and forward deltas (small batches, long TTFT); at equal priority they share.
            log.info("engine threads (%d) fill every core: the engine keeps nice 0", threads)
            nice = None
        engine_cfg = config.engine
        if config.drafter_mode != "in_process":
            engine_cfg = engine_cfg.model_copy(update={"drafter": None})  # the actor holds it, or nobody does
        self.draft_actor = None
        self.replica_id = _replica_id()
        # Named, so an operator (or a fault-injection test) can find this replica's draft actor: ray.get_actor(name,
        # namespace). The suffix keeps two LLMServers of one process (tests) apart.
        self.draft_actor_name = f"dspark-draft:{self.replica_id}:{uuid.uuid4().hex[:8]}"
        draft, drafter_error = None, None
        if config.uses_draft_actor:
            try:
                draft = self._start_draft_actor(config)
            except Exception as exc:  # serve without speculation, and say why (as the engine does in-process)
                drafter_error = f"draft actor for drafter {config.engine.drafter!r} could not start: {exc}"
                log.error("%s; serving without speculation", drafter_error)
                if self.draft_actor is not None:
                    ray.kill(self.draft_actor)
                    self.draft_actor = None
        # How an engine reaches the actor: a proxy over the actor's socket, given a locator for reconnects.
        connect = None if draft is None else functools.partial(
            DraftServiceProxy.connect, draft["info"], device=draft["device"], timeout_s=draft["timeout_s"])
        if config.engine_process:
            # The engine steps in a child process, so this process's event loops never hold its GIL.
            self.engine = EngineProcess(engine_cfg, connect, self.draft_actor, thread_nice=nice,
                                        torch_threads=threads, drafter_error=drafter_error,
                                        startup_timeout_s=config.draft_actor.startup_timeout_s,
                                        output_interval=(config.stream_interval_ms / 1000,
                                                         config.stream_max_deltas_per_s))
            info = self.engine.info
        else:
            proxy = None if connect is None else connect(RayLocator(self.draft_actor))
            engine = LLMEngine(engine_cfg, drafter_factory=None if proxy is None else lambda target: proxy)
            if drafter_error:
                engine.drafter_error = drafter_error
            self.engine = AsyncLLMEngine(engine, thread_nice=nice)
            info = engine_info(engine)
        self.max_model_len = info["max_model_len"]
        self.vocab_size = info["vocab_size"]
        self.speculation = info["speculation"]
        self.drafter_error = info["drafter_error"]
        self.metrics = ReplicaMetrics(config.model_name, self.max_model_len)
        self.live_streams = 0
        self._draft_contexts_live = 0.0
        self._actor_stats_ref = None
        self.ray_gauges = RayGauges({"replica": self.replica_id}) if config.metrics.ray_metrics else None
        if metrics_hub is not None and config.metrics.enabled:
            self.pusher = MetricsPusher(metrics_hub, self.replica_id, self.metrics_families,
                                        config.metrics.push_interval_s)
        log.info("LLM replica ready: %s, speculation %s%s", config.model_name, self.speculation,
                 f" ({self.drafter_error})" if self.drafter_error else "")

    def _start_draft_actor(self, config: LLMServingConfig) -> dict:
        """Start this replica's draft actor; returns what an engine needs to reach it: the actor's info (its socket
        address among it), the engine's device and the step timeout."""
        from transformers import AutoConfig

        ec, opts = config.engine, config.draft_actor
        target = resolve_model(ec.model)
        drafter = resolve_drafter(ec.drafter, AutoConfig.from_pretrained(target))  # fail here, not in the actor
        device = resolve_device(ec.device)
        dtype = resolve_dtype(ec.dtype, device)
        actor_device = device if opts.num_gpus > 0 else torch.device("cpu")
        self.draft_actor = start_draft_actor(
            str(drafter), str(target), str(dtype).removeprefix("torch."), str(actor_device),
            draft_context_tokens(target, ec, dtype, device), num_cpus=opts.num_cpus, num_gpus=opts.num_gpus,
            max_restarts=opts.max_restarts, num_threads=opts.num_threads, name=self.draft_actor_name,
            placement_group=ray.util.get_current_placement_group(), bundle_index=0)
        info = ray.get(self.draft_actor.info.remote(), timeout=opts.startup_timeout_s)  # raises if it cannot start
        return {"info": info, "device": str(device), "timeout_s": opts.step_timeout_s}

    # ----- requests -------------------------------------------------------------------------------------------

    async def stream(self, request_id: str, prompt: list[int] | str, params: dict) -> AsyncIterator[dict]:
        """First item: {"admitted": True} or an error; then one delta per engine output (see _delta). If the caller
        goes away (client disconnect -> Serve cancels this generator) the request is aborted."""
        try:
            stream = await self.engine.add_request(request_id, prompt, SamplingParams(**params),
                                                   min_interval_s=self._stream_interval_s)
        except Exception as exc:
            yield _error(exc)
            return
        last = None
        self.live_streams += 1
        try:
            yield {"admitted": True}
            async for out in stream:
                last = out
                yield _delta(out)
        except Exception as exc:
            yield _error(exc)
        finally:
            self.live_streams -= 1
            stream.close()  # no-op when finished; aborts on cancellation or an early exit
            self._observe(last)

    def _stream_interval_s(self) -> float:
        return stream_interval_s(self.config.stream_interval_ms / 1000, self.live_streams,
                                 self.config.stream_max_deltas_per_s)

    async def generate(self, request_id: str, prompt: list[int] | str, params: dict) -> dict:
        """The whole answer at once: text, token ids, logprobs, finish reason and metrics (or an error)."""
        text, token_ids, logprobs, last = [], [], [], None
        try:
            async for out in self.engine.generate(request_id, prompt, SamplingParams(**params)):
                last = _delta(out)
                text.append(last["text"])
                token_ids += last["token_ids"]
                logprobs += last.get("logprobs", [])
        except Exception as exc:
            return _error(exc)
        finally:
            if last is not None:  # finished, or aborted / failed midway (counted as "abort")
                self.metrics.observe_finished(last["finish_reason"] if last["finished"] else None,
                                              last.get("metrics"))
        return {**last, "text": "".join(text), "token_ids": token_ids,
                "logprobs": logprobs if params.get("logprobs") is not None else None}

    # ----- introspection -------------------------------------------------------------------------------------

    def info(self) -> dict:
        return {"model": self.config.model_name, "max_model_len": self.max_model_len,
                "vocab_size": self.vocab_size,
                "speculation": self.speculation, "drafter_error": self.drafter_error,
                "drafter_mode": self.config.drafter_mode}

    async def stats(self) -> dict:
        stats = {**self.engine.stats(), "replica": serve.get_replica_context().replica_id.unique_id}
        if self.draft_actor is not None:
            try:
                stats["draft_actor"] = await self.draft_actor.stats.remote()
            except Exception as exc:
                stats["draft_actor"] = {"error": repr(exc)}
        return stats

    async def placement(self) -> dict:
        """Where this replica and its draft actor run (node ids and GPU ids as Ray assigned them)."""
        ctx = ray.get_runtime_context()
        out = {"replica": serve.get_replica_context().replica_id.unique_id, "node_id": ctx.get_node_id(),
               "actor_name": ctx.get_actor_name(),  # Serve's replica actor, in the "serve" namespace
               "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid(),
               "placement_group": (pg.id.hex() if (pg := ray.util.get_current_placement_group()) else None),
               "draft_actor": None}
        if self.draft_actor is not None:
            info = await self.draft_actor.info.remote()
            out["draft_actor"] = {**{k: info[k] for k in ("node_id", "gpu_ids", "pid", "device", "incarnation")},
                                  "name": self.draft_actor_name, "namespace": ctx.namespace}
        return out

    def health(self) -> dict:
        return {"alive": self.engine.is_alive, "reason": self.engine.dead_reason}

    # ----- load signals and metrics -------------------------------------------------------------------------------

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom autoscaling metrics: the engine's load signals (engine/load.py; names in
        autoscale.policy.METRICS), from the engine thread's last published stats -- no engine or Ray call."""
        return dict(self.engine.stats()["load"])

    def _observe(self, out: RequestOutput | None) -> None:
        if out is None:
            return  # no output yet (refused, or gone before its first token): not counted
        self.metrics.observe_finished(out.finish_reason if out.finished else None, out.metrics)

    def metrics_families(self) -> list[dict]:
        """This replica's metrics snapshot (deployments/metrics.py). Called by the pusher thread every second."""
        stats = self.engine.stats()
        gauges = ReplicaMetrics.gauge_values(stats, stats["load"],
                                             draft_contexts_live=self._poll_draft_contexts(),
                                             rss_bytes=self._rss_bytes())
        if self.ray_gauges is not None:
            self.ray_gauges.set(gauges)
        return self.metrics.families(stats, gauges)

    def _rss_bytes(self) -> float:
        """This replica's resident memory: its process, plus its engine process."""
        rss = process_rss_bytes()
        if isinstance(self.engine, EngineProcess) and self.engine.is_alive:
            rss += process_rss_bytes(self.engine.pid)
        return rss

    def _poll_draft_contexts(self) -> float:
        """Live draft contexts: from the draft actor (one stats call in flight at a time, never awaited here), or
        from the in-process draft service (its pool size, in the engine's published stats)."""
        if self.draft_actor is not None:
            ref = self._actor_stats_ref
            if ref is not None:
                ready, _ = ray.wait([ref], timeout=0)
                if ready:
                    self._actor_stats_ref = None
                    try:
                        self._draft_contexts_live = float(ray.get(ref).get("live_contexts", 0))
                    except Exception:
                        pass  # restarting: keep the last value
            if self._actor_stats_ref is None:
                self._actor_stats_ref = self.draft_actor.stats.remote()
            return self._draft_contexts_live
        return float(self.engine.stats().get("draft_contexts_live", 0))

    def check_health(self) -> None:
        """Serve's health check: a dead engine thread gets this replica replaced."""
        if not self.engine.is_alive:
            raise RuntimeError(f"engine is not running: {self.engine.dead_reason}")

    def shutdown(self) -> None:
        pusher = getattr(self, "pusher", None)
        if pusher is not None:
            pusher.stop()
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown(timeout=5)

    def __del__(self):
        self.shutdown()


def _replica_id() -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside a Serve replica (tests constructing the class directly)
        return f"pid{os.getpid()}"


def _assigned_cpus() -> int:
    try:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
    except Exception:
        cpus = 1
    return max(1, math.floor(cpus))


LLMDeployment = serve.deployment(LLMServer, name="LLMServer")


class OpenAIServer(OpenAIIngress):
    """ingress_mode 'in_replica': one replica serves the OpenAI routes and runs the LLM server (engine, draft actor)
    itself, so Serve's proxy routes HTTP straight to the LLM replicas: a streamed delta crosses one process boundary
    (replica -> proxy) instead of two, and no ingress process competes with the engines for CPU."""

    async def __init__(self, config: LLMServingConfig, metrics_hub=None):
        await super().__init__(LLMServer(config), config, metrics_hub)  # one pusher: the server's and the routes'

    # What Serve, operators and tests call on an LLM replica (`stats` is the ingress's route, with the same answer).
    def record_autoscaling_stats(self) -> dict[str, float]:
        return self.llm.record_autoscaling_stats()

    def check_health(self) -> None:
        self.llm.check_health()

    def info(self) -> dict:
        return self.llm.info()

    async def placement(self) -> dict:
        return await self.llm.placement()

    async def __del__(self):  # Serve's ingress wrapper has an async __del__ (the ASGI lifespan's shutdown)
        await super().__del__()
        self.llm.shutdown()


# Named as the separate layout's LLM deployment: either way "LLMServer" is the deployment whose replicas hold engines.
OpenAIServerDeployment = serve.deployment(OpenAIServer, name="LLMServer")
