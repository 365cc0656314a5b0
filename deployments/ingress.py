"""The OpenAI-compatible HTTP ingress: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics
(Prometheus text of every replica, deployments/metrics.py) and /openapi.json (the real request bodies, narrowed by
this deployment's limits).

It rate-limits clients (LLMServingConfig.rate_limit, off by default), validates and tokenizes requests (the chat
template comes from the tokenizer), enforces the request limits, and talks to the LLM replicas through a
DeploymentHandle: one call per choice, streaming calls for SSE. With ingress_mode 'in_replica' the same class runs
inside each LLM replica (deployments/server.py, OpenAIServer) and calls its LLMServer in process instead. Every error is
`{"error": {"message", "type", "param", "code"}}` (ASCII JSON) with a 4xx/5xx status, including errors nobody
foresaw (500) and a replica dying under a request (503; inside a stream: an error event, then [DONE]); the server
keeps serving.
"""
# No `from __future__ import annotations`, and every helper is defined above the class: Serve's class-based ingress
# rebuilds the route methods with a snapshot of the globals they use, taken when the class is decorated, and FastAPI
# must see the real `Request` annotation.
import asyncio
import inspect
import json
import logging
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException as StarletteHTTPException

from deployments.config import LLMServingConfig
from deployments.metrics import MetricsPusher, ingress_metrics, render
from deployments.openai_protocol import (APIError, ChatChoice, ChatChunkChoice, ChatCompletionChunk,
                                         ChatCompletionRequest, ChatCompletionResponse, ChatLogprobs,
                                         ChatMessageOut, CompletionChoice, CompletionChunk, CompletionLogprobs,
                                         CompletionRequest, CompletionResponse, DeltaMessage, ModelCard, ModelList,
                                         PromptTokensDetails, ResponseMetrics, SpeculativeDecodingMetrics,
                                         TokenLogprob, TopLogprob, UsageInfo, openapi_schema, random_id,
                                         validation_message)
from deployments.ratelimit import TokenBuckets, client_key, retry_after_header
from engine.loader import resolve_model
from engine.sampling_params import SamplingParams

log = logging.getLogger("ray.serve")
# FastAPI's own /openapi.json would show no request bodies (the routes read the raw body, to enforce the size limit
# before parsing); the ingress serves its own document instead.
app = FastAPI(title="dspark-serve", docs_url=None, redoc_url=None, openapi_url=None)


def _error_response(err: APIError) -> Response:
    # ensure_ascii: a message quoting client input (e.g. a lone surrogate) must not break the encoding.
    body = json.dumps(err.body(), ensure_ascii=True, separators=(",", ":"))
    return Response(body, status_code=err.status, media_type="application/json", headers=err.headers)


@app.middleware("http")
async def _count_requests(request: Request, call_next):
    t0 = time.perf_counter()
    status = 500
    try:
        response = await call_next(request)
        status = response.status_code
        return response
    finally:
        route = request.scope.get("route")
        ingress_metrics().observe(getattr(route, "path", None) or "other", status, time.perf_counter() - t0)


@app.exception_handler(APIError)
async def _api_error(_, exc: APIError):
    return _error_response(exc)


@app.exception_handler(StarletteHTTPException)
async def _http_error(_, exc: StarletteHTTPException):
    return _error_response(APIError(exc.status_code, str(exc.detail), headers=exc.headers))


@app.exception_handler(RequestValidationError)
async def _validation_error(_, exc: RequestValidationError):
    return _error_response(APIError(400, validation_message(exc)))


@app.exception_handler(Exception)
async def _unexpected_error(_, exc: Exception):
    # A bug, not the client's fault: still an OpenAI error object rather than Starlette's plain-text 500.
    log.error("unhandled error in the ingress: %r", exc, exc_info=exc)
    return _error_response(APIError(500, f"internal error ({type(exc).__name__}); the request was not completed"))


def _metrics(per_choice: list[dict | None]) -> ResponseMetrics:
    return ResponseMetrics(speculative_decoding=SpeculativeDecodingMetrics.total([m or {} for m in per_choice]))


def _sse_data(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def _wrap_seed(seed: int) -> int:
    """seed + j for choice j, kept inside torch's 64-bit seed range."""
    return seed - 2**64 if seed >= 2**63 else seed


def _first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:limit]


def _routing_error(exc: Exception) -> APIError:
    if isinstance(exc, BackPressureError):
        return APIError(503, f"the server is overloaded (too many queued requests); retry later: {exc}")
    if isinstance(exc, DeploymentUnavailableError):
        return APIError(503, f"no LLM replica is available: {exc}")
    if isinstance(exc, (RayActorError, ReplicaUnavailableError)):
        # The replica died (or became unreachable) under this request; Serve replaces it. Retrying is safe.
        log.warning("LLM replica failed under a request: %s", _first_line(exc))
        return APIError(503, f"the LLM replica serving this request failed ({type(exc).__name__}: "
                             f"{_first_line(exc)}); retry the request")
    log.exception("LLM call failed")
    return APIError(500, f"internal error: {type(exc).__name__}: {_first_line(exc)}")


def _error_item(exc: Exception) -> dict:
    err = _routing_error(exc)
    return {"error": err.message, "status": err.status}


async def _merge(gens) -> AsyncIterator[tuple[int, dict]]:
    """Items of several streams as they come, tagged with the stream's index; a failing stream ends with an
    error item."""
    if len(gens) == 1:
        try:
            async for item in gens[0]:
                yield 0, item
        except Exception as exc:
            yield 0, _error_item(exc)
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i, gen):
        try:
            async for item in gen:
                await queue.put((i, item))
        except Exception as exc:
            await queue.put((i, _error_item(exc)))
        finally:
            await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(gens)]
    try:
        live = len(gens)
        while live:
            i, item = await queue.get()
            if item is None:
                live -= 1
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()


class _LocalStream:
    """LLMServer.stream run in this replica, with the `cancel()` of Serve's streaming response (which throws into
    the generator where it waits, so its `finally` aborts the engine request)."""

    def __init__(self, gen):
        self.gen, self._next = gen, None

    def __aiter__(self):
        return self

    async def __anext__(self):
        self._next = asyncio.ensure_future(self.gen.__anext__())
        return await self._next

    def cancel(self) -> None:
        if self._next is not None and not self._next.done():
            self._next.cancel()
        else:
            asyncio.ensure_future(self.gen.aclose())


class _Choice:
    """One choice of a request: its prompt, its engine call and what has been streamed so far."""

    def __init__(self, index: int, prompt_index: int, prompt: list[int], params: dict):
        self.index, self.prompt_index, self.prompt, self.params = index, prompt_index, prompt, params
        self.text_len = 0
        self.num_output_tokens = 0
        self.metrics: dict = {}
        self.started = False
        self.finished = False


@serve.ingress(app)
class OpenAIIngress:
    def __init__(self, llm, config: LLMServingConfig, metrics_hub: DeploymentHandle = None):
        """`llm`: a DeploymentHandle of the LLM deployment, or an LLMServer in this replica (ingress_mode
        'in_replica', deployments/server.py)."""
        from transformers import AutoTokenizer


        self.llm = llm
        self.local = not isinstance(llm, DeploymentHandle)
        self.llm_stream = None if self.local else llm.options(stream=True)
        self.config = config
        self.limits = config.limits
        self.rate_limit = config.rate_limit
        self.buckets = (TokenBuckets(config.rate_limit.requests_per_s, config.rate_limit.burst,
                                     config.rate_limit.max_clients) if config.rate_limit.enabled else None)
        self.model_name = config.model_name
        self._openapi: dict | None = None
        self.tokenizer = AutoTokenizer.from_pretrained(resolve_model(config.engine.model))
        self._info: dict | None = None
        self.metrics_hub = metrics_hub
        try:
            self.replica_id = serve.get_replica_context().replica_id.unique_id
        except Exception:
            self.replica_id = "ingress"
        self.pusher = None
        if metrics_hub is not None and config.metrics.enabled:  # so every ingress replica's /metrics has them all
            self.pusher = MetricsPusher(metrics_hub, self.replica_id, self._live_families,
                                        config.metrics.push_interval_s)

    def __del__(self):
        if getattr(self, "pusher", None) is not None:
            self.pusher.stop()

    def _live_families(self) -> list:
        """This replica's own metrics: the ingress's (and, in one replica with the LLM server, the server's)."""
        families = ingress_metrics().families()
        return self.llm.metrics_families() + families if self.local else families

    def _call(self, method: str, *args):
        """LLMServer.<method>(*args) as an awaitable with `cancel()`: through the handle, or in this replica."""
        if not self.local:
            return getattr(self.llm, method).remote(*args)

        async def run():
            result = getattr(self.llm, method)(*args)
            return await result if inspect.isawaitable(result) else result

        return asyncio.ensure_future(run())

    def _open_stream(self, *args):
        if not self.local:
            return self.llm_stream.stream.remote(*args)
        return _LocalStream(self.llm.stream(*args))

    # ----- routes ------------------------------------------------------------------------------------------------

    @app.get("/health")
    async def health(self):
        try:
            state = await asyncio.wait_for(self._call("health"), timeout=10)
        except Exception as exc:
            raise APIError(503, f"no healthy LLM replica: {exc!r}")
        if not state["alive"]:
            raise APIError(503, f"engine not running: {state['reason']}")
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics(self):
        """Prometheus text: every replica's samples as last pushed to the metrics hub (at most a push interval old),
        each with a `replica` label, this ingress's own live ones, and `dspark:metrics_age_seconds` per replica."""
        sources = {}
        if self.metrics_hub is not None:
            try:
                sources = await asyncio.wait_for(self.metrics_hub.snapshot.remote(), timeout=5)
            except Exception as exc:  # serve what this replica has; the age gauge shows the others missing
                log.warning("metrics hub unavailable: %r", exc)
        sources = {**sources, self.replica_id: {"time": time.time(), "families": self._live_families()}}
        return Response(render(sources), media_type=CONTENT_TYPE_LATEST)

    @app.get("/stats")
    async def stats(self):
        """Engine statistics of one replica (the one the router picks)."""
        try:
            return await self._call("stats")
        except Exception as exc:
            raise _routing_error(exc) from exc

    @app.get("/openapi.json")
    async def openapi(self):
        """The OpenAPI document: every route, the real request bodies narrowed by this deployment's limits, and the
        OpenAI error shape of every 4xx/5xx."""
        if self._openapi is None:
            info = await self._engine_info()
            self._openapi = openapi_schema(self.model_name, self.limits, info["max_model_len"],
                                           info.get("vocab_size"))
        return self._openapi

    @app.get("/v1/models")
    async def models(self):
        info = await self._engine_info()
        return ModelList(data=[ModelCard(id=self.model_name, max_model_len=info["max_model_len"])]).model_dump()

    @app.post("/v1/completions")
    async def completions(self, request: Request):
        req = await self._parse(request, CompletionRequest)
        try:
            raw = req.prompts()
        except ValueError as exc:
            raise APIError(400, str(exc), "prompt")
        if len(raw) * req.n > self.limits.max_choices:  # before tokenizing any of them
            raise APIError(400, f"at most {self.limits.max_choices} choices (prompts x n) per request", "n")
        try:
            prompts = [self._encode_text(p) if isinstance(p, str) else p for p in raw]
        except ValueError as exc:
            raise APIError(400, str(exc), "prompt")
        if req.logprobs is not None and req.logprobs > self.limits.max_logprobs:
            raise APIError(400, f"logprobs must be at most {self.limits.max_logprobs}", "logprobs")
        choices = await self._plan(req, prompts, req.logprobs, self.limits.default_completion_max_tokens)
        rid = random_id("cmpl")
        if req.stream:
            return await self._stream(rid, req, choices, chat=False)
        results = await self._run(rid, choices)
        out = []
        for c, r in zip(choices, results):
            lp = self._completion_logprobs(r["logprobs"], req.logprobs, 0) if req.logprobs is not None else None
            out.append(CompletionChoice(index=c.index, text=r["text"], logprobs=lp, finish_reason=r["finish_reason"]))
        resp = CompletionResponse(id=rid, model=self.model_name, choices=out, usage=self._usage(choices, results),
                                  metrics=_metrics([r.get("metrics") for r in results]))
        return JSONResponse(resp.model_dump())

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        req = await self._parse(request, ChatCompletionRequest)
        if len(req.messages) > self.limits.max_messages:
            raise APIError(400, f"at most {self.limits.max_messages} messages per request", "messages")
        if req.top_logprobs is not None:
            if not req.logprobs:
                raise APIError(400, "top_logprobs requires logprobs=true", "top_logprobs")
            if req.top_logprobs > self.limits.max_logprobs:
                raise APIError(400, f"top_logprobs must be at most {self.limits.max_logprobs}", "top_logprobs")
        try:
            prompt = list(self.tokenizer.apply_chat_template(
                [m.as_template_dict() for m in req.messages], add_generation_prompt=True, tokenize=True,
                return_dict=True)["input_ids"])
        except Exception as exc:  # a template that rejects the conversation (e.g. roles out of order)
            raise APIError(400, f"cannot apply the chat template: {exc}", "messages")
        k = (req.top_logprobs or 0) if req.logprobs else None
        choices = await self._plan(req, [prompt], k, self.limits.default_chat_max_tokens)
        rid = random_id("chatcmpl")
        if req.stream:
            return await self._stream(rid, req, choices, chat=True)
        results = await self._run(rid, choices)
        out = [ChatChoice(index=c.index, message=ChatMessageOut(content=r["text"]), finish_reason=r["finish_reason"],
                          logprobs=self._chat_logprobs(r["logprobs"], k) if k is not None else None)
               for c, r in zip(choices, results)]
        resp = ChatCompletionResponse(id=rid, model=self.model_name, choices=out, usage=self._usage(choices, results),
                                      metrics=_metrics([r.get("metrics") for r in results]))
        return JSONResponse(resp.model_dump())

    # ----- validation ------------------------------------------------------------------------------------------

    def _check_rate(self, request: Request) -> None:
        """One token from the client's bucket, or 429 with Retry-After (LLMServingConfig.rate_limit)."""
        if self.buckets is None:
            return
        rl = self.rate_limit
        key = client_key(request.headers, request.client.host if request.client else None, rl.key,
                         rl.trust_forwarded_for)
        wait = self.buckets.take(key)
        if wait > 0:
            raise APIError(429, f"rate limit exceeded: at most {rl.requests_per_s:g} requests/s (burst {rl.burst}) "
                                f"per client; retry after {wait:.2f} s",
                           headers={"Retry-After": retry_after_header(wait)})

    async def _read_body(self, request: Request) -> bytes:
        """The body, refused with 413 as soon as it is known to exceed the limit (declared or while it streams in)."""
        limit = self.limits.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > limit:
            raise APIError(413, f"request body is {declared} bytes; the limit is {limit}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise APIError(413, f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def _parse(self, request: Request, cls):
        self._check_rate(request)
        body = await self._read_body(request)
        try:
            req = cls.model_validate_json(body)
        except ValidationError as exc:
            raise APIError(400, validation_message(exc))
        if req.model is not None and req.model != self.model_name:
            raise APIError(404, f"The model `{req.model}` does not exist. Served: `{self.model_name}`", "model")
        return req

    def _encode_text(self, text: str) -> list[int]:
        # Exactly what LLMEngine.encode does for a string, so HTTP and in-process answers match.
        try:
            ids = self.tokenizer(text, add_special_tokens=True).input_ids
        except Exception as exc:  # e.g. a lone surrogate the tokenizer cannot encode
            raise ValueError(f"prompt cannot be tokenized: {type(exc).__name__}") from None
        if not ids:
            raise ValueError("prompt is empty")
        return list(ids)

    async def _engine_info(self) -> dict:
        if self._info is None:
            try:
                self._info = await self._call("info")
            except Exception as exc:
                raise APIError(503, f"no LLM replica is available: {exc!r}")
        return self._info

    async def _plan(self, req, prompts: list[list[int]], logprobs: int | None, default_max: int) -> list[_Choice]:
        """Check the limits and build one engine request per (prompt, n)."""
        lim = self.limits
        if req.n > lim.max_n:
            raise APIError(400, f"n must be at most {lim.max_n}", "n")
        if len(prompts) * req.n > lim.max_choices:
            raise APIError(400, f"at most {lim.max_choices} choices (prompts x n) per request", "n")
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if len(stops) > lim.max_stop:
            raise APIError(400, f"at most {lim.max_stop} stop strings", "stop")
        if any(len(s) > lim.max_stop_chars for s in stops):
            raise APIError(400, f"stop strings must be at most {lim.max_stop_chars} characters", "stop")
        if len(req.stop_token_ids or ()) > lim.max_stop_token_ids:
            raise APIError(400, f"at most {lim.max_stop_token_ids} stop_token_ids", "stop_token_ids")
        max_len = (await self._engine_info())["max_model_len"]
        max_prompt = min(lim.max_prompt_tokens or max_len - 1, max_len - 1)
        requested = req.requested_max_tokens()
        if requested is not None and not 1 <= requested <= lim.max_tokens:
            raise APIError(400, f"max_tokens must be between 1 and {lim.max_tokens}, got {requested}", "max_tokens")
        choices = []
        for pi, prompt in enumerate(prompts):
            if not prompt:
                raise APIError(400, "prompt is empty", "prompt")
            if len(prompt) > max_prompt:
                raise APIError(400, f"prompt has {len(prompt)} tokens; this model takes at most {max_prompt} "
                                    f"(context {max_len} tokens including the output)", "prompt")
            room = max_len - len(prompt)
            if requested is not None and requested > room:
                raise APIError(400, f"This model's maximum context length is {max_len} tokens. However, you "
                                    f"requested {len(prompt) + requested} tokens ({len(prompt)} in the prompt, "
                                    f"{requested} for the completion).", "max_tokens")
            max_tokens = requested if requested is not None else min(default_max, room)
            for j in range(req.n):
                seed = None if req.seed is None else _wrap_seed(req.seed + j)
                params = dict(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, max_tokens=max_tokens,
                              seed=seed, stop=stops or None, stop_token_ids=req.stop_token_ids,
                              ignore_eos=req.ignore_eos, logprobs=logprobs, speculation=req.speculation,
                              presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                              repetition_penalty=req.repetition_penalty, logit_bias=req.token_logit_bias())
                try:
                    SamplingParams(**params)  # the engine's own validation, before anything is routed
                except ValueError as exc:
                    raise APIError(400, str(exc))
                choices.append(_Choice(len(choices), pi, prompt, params))
        return choices

    # ----- running ----------------------------------------------------------------------------------------------

    async def _run(self, rid: str, choices: list[_Choice]) -> list[dict]:
        calls = [self._call("generate", f"{rid}-{c.index}", c.prompt, c.params) for c in choices]
        try:
            results = await asyncio.gather(*calls)
        except BaseException as exc:
            for call in calls:
                call.cancel()
            if isinstance(exc, Exception):
                raise _routing_error(exc) from exc
            raise  # cancelled: the client went away
        for r in results:
            if "error" in r:
                raise APIError(r["status"], r["error"])
        return results

    async def _stream(self, rid: str, req, choices: list[_Choice], chat: bool):
        gens = [self._open_stream(f"{rid}-{c.index}", c.prompt, c.params) for c in choices]
        try:
            # Every choice is admitted (or refused) before the response starts, so a full queue is a clean 429.
            firsts = await asyncio.gather(*[anext(g) for g in gens])
        except BaseException as exc:
            for g in gens:
                g.cancel()
            if isinstance(exc, Exception):
                raise _routing_error(exc) from exc
            raise
        refused = [f for f in firsts if "error" in f]
        if refused:
            for g in gens:
                g.cancel()
            raise APIError(refused[0]["status"], refused[0]["error"])
        return StreamingResponse(self._sse(rid, req, choices, gens, chat), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def _sse(self, rid: str, req, choices: list[_Choice], gens, chat: bool) -> AsyncIterator[str]:
        """The SSE body. It always ends with an error event or the last chunks, then [DONE]: a stream is never
        cut short silently, even by a bug here (the HTTP status is already 200 by then)."""
        try:
            async for event in self._sse_events(rid, req, choices, gens, chat):
                yield event
        except Exception as exc:
            log.error("stream %s failed: %r", rid, exc, exc_info=exc)
            yield _sse_data(APIError(500, f"internal error ({type(exc).__name__}); the stream was not "
                                          "completed").body())
        finally:
            for g in gens:  # a client that went away: stop every engine request of this response
                g.cancel()
        yield "data: [DONE]\n\n"

    async def _sse_events(self, rid: str, req, choices: list[_Choice], gens, chat: bool) -> AsyncIterator[str]:
        created = int(time.time())
        k = choices[0].params["logprobs"]
        remaining = len(choices)
        async for i, item in _merge(gens):
            c = choices[i]
            if "error" in item:
                yield _sse_data(APIError(item["status"], item["error"]).body())
                break
            c.num_output_tokens = item["num_output_tokens"]
            if item["finished"]:
                c.finished, c.metrics = True, item.get("metrics", {})
                remaining -= 1
            lp = item.get("logprobs")
            if not (item["text"] or item["finished"] or lp or (chat and not c.started)):
                continue  # tokens whose text is not releasable yet (partial UTF-8, a possible stop string)
            metrics = _metrics([x.metrics for x in choices]) if item["finished"] and not remaining else None
            if chat:
                delta = DeltaMessage(content=item["text"], role=None if c.started else "assistant")
                chunk = ChatCompletionChunk(
                    id=rid, created=created, model=self.model_name, metrics=metrics,
                    choices=[ChatChunkChoice(index=c.index, delta=delta, finish_reason=item["finish_reason"],
                                             logprobs=self._chat_logprobs(lp, k) if lp else None)])
            else:
                chunk = CompletionChunk(
                    id=rid, created=created, model=self.model_name, metrics=metrics,
                    choices=[CompletionChoice(
                        index=c.index, text=item["text"], finish_reason=item["finish_reason"],
                        logprobs=self._completion_logprobs(lp, k, c.text_len) if lp else None)])
            c.started = True
            c.text_len += len(item["text"])
            yield _sse_data(chunk.model_dump(exclude_none=True))
        else:
            if req.include_usage:
                cls = ChatCompletionChunk if chat else CompletionChunk
                usage = self._usage(choices, [{"num_output_tokens": c.num_output_tokens, "metrics": c.metrics}
                                              for c in choices])
                yield _sse_data(cls(id=rid, created=created, model=self.model_name, choices=[], usage=usage,
                                    metrics=_metrics([c.metrics for c in choices])).model_dump(exclude_none=True))

    # ----- response pieces -------------------------------------------------------------------------------------

    def _usage(self, choices: list[_Choice], results: list[dict]) -> UsageInfo:
        prompt = sum(len(p) for p in {c.prompt_index: c.prompt for c in choices}.values())
        completion = sum(r["num_output_tokens"] for r in results)
        cached: dict[int, int] = {}  # per prompt: choices of one prompt (n > 1) share its cached tokens
        for c, r in zip(choices, results):
            hit = (r.get("metrics") or {}).get("num_cached_tokens", 0)
            cached[c.prompt_index] = max(cached.get(c.prompt_index, 0), hit)
        return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                         prompt_tokens_details=PromptTokensDetails(cached_tokens=sum(cached.values())))

    def _token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def _top(self, entry: dict, k: int) -> list[tuple[int, float]]:
        return sorted(entry.items(), key=lambda kv: -kv[1])[:k]

    def _completion_logprobs(self, entries: list[dict], k: int, offset: int) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for tid, entry in entries:
            tok = self._token(tid)
            out.tokens.append(tok)
            out.token_logprobs.append(entry[tid])
            out.top_logprobs.append({self._token(t): lp for t, lp in self._top(entry, k)})
            out.text_offset.append(offset)
            offset += len(tok)
        return out

    def _chat_logprobs(self, entries: list[dict], k: int) -> ChatLogprobs:
        content = []
        for tid, entry in entries:
            tok = self._token(tid)
            tops = [TopLogprob(token=(s := self._token(t)), logprob=lp, bytes=list(s.encode()))
                    for t, lp in self._top(entry, k)]
            content.append(TokenLogprob(token=tok, logprob=entry[tid], bytes=list(tok.encode()), top_logprobs=tops))
        return ChatLogprobs(content=content)


OpenAIIngressDeployment = serve.deployment(OpenAIIngress, name="OpenAIIngress")
