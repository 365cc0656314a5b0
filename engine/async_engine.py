"""LLMEngine for asyncio servers: one engine thread steps the engine; coroutines submit requests and read deltas.

LLMEngine is not thread-safe, so only the engine thread touches it. Coroutines put `add`/`abort` commands in an inbox
that the engine thread drains at the start of every iteration, and the engine thread hands results back to each
request's own event loop with `call_soon_threadsafe`. While there is no work the thread sleeps on a condition.
"""
from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from engine.llm_engine import LLMEngine, RequestOutput
from engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)

IDLE_PUBLISH_S = 0.5  # how often an idle engine thread republishes its stats
MAX_CONSECUTIVE_STEP_FAILURES = 3  # then the engine is declared dead (check_health fails, Serve replaces it)


def release_free_heap() -> bool:
    """Give the heap memory freed by a burst back to the OS (glibc's malloc_trim). A burst's large batch tensors are
    freed into malloc's arenas, which glibc keeps, so an idle replica would otherwise stay at its burst peak RSS."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass
    return True


def set_nice(nice: int | None) -> None:
    """Give the calling thread (and the threads it starts later) this nice value; lower runs first, and below 0
    needs CAP_SYS_NICE: without it the thread keeps its priority, with a warning."""
    if nice is None:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)  # this thread only (Linux)
    except (OSError, AttributeError) as exc:
        log.warning("the engine keeps its priority (nice %d not permitted: %s)", nice, exc)


def engine_info(engine: LLMEngine) -> dict:
    """What a server needs from the engine object itself."""
    return {"max_model_len": engine.max_model_len, "vocab_size": engine.model.vocab_size,
            "speculation": engine.speculator is not None, "drafter_error": engine.drafter_error}


def published_stats(engine: LLMEngine, in_flight: int, dead: str | None) -> dict:
    """The stats a server reads between steps: the engine's, without the draft-service call (a round trip with a
    draft actor, too slow for every step; LLMServer.stats asks the actor itself), plus the wrapper's own keys and
    the live contexts of an in-process draft service."""
    pool = getattr(getattr(engine.speculator, "service", None), "pool", None)
    return {**engine.stats(service=False), "in_flight": in_flight, "alive": dead is None, "dead_reason": dead,
            "time": time.time(), "draft_contexts_live": getattr(pool, "num_live_contexts", 0) or 0}


class EngineDeadError(RuntimeError):
    """The engine thread stopped (shutdown or repeated step failures); the request cannot run here."""


class EngineStepError(RuntimeError):
    """An engine step raised; every request in flight at that moment is failed with this error."""


class RequestAbortedError(RuntimeError):
    """The request was aborted by `abort()` while a consumer was still reading it."""


@dataclass(eq=False)
class _Request:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    admitted: asyncio.Future  # result None once add_request succeeded, or its exception
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)  # RequestOutput | BaseException
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # the last item (finished or an error) is queued


class RequestStream:
    """The outputs of one admitted request. Iterating yields RequestOutput deltas (several pending deltas are merged
    into one, so a slow reader does not fall behind); leaving early (break, cancellation, aclose) aborts the
    request in the engine.

    `min_interval_s` coalesces: after a delta, the next one is held until that much time has passed (the deltas
    up to the first with text, and the last, are never held). Every delta a server forwards costs a message per hop,
    whatever its size. A callable is asked before every delta (a server stretches the interval under load:
    stream_interval_s)."""

    def __init__(self, engine: AsyncLLMEngine, req: _Request, min_interval_s: float | Callable[[], float] = 0.0):
        self._engine = engine
        self._req = req
        self.min_interval_s = min_interval_s
        self.finished = False

    @property
    def request_id(self) -> str:
        return self._req.request_id

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        q = self._req.queue
        loop = asyncio.get_running_loop()
        last_yield = None
        try:
            while not self.finished:
                items = [await q.get()]
                interval = self.min_interval_s() if callable(self.min_interval_s) else self.min_interval_s
                if interval and last_yield is not None and not self._req.ended.is_set():
                    wait = last_yield + interval - loop.time()
                    if wait > 0:
                        try:
                            async with asyncio.timeout(wait):
                                await self._req.ended.wait()  # the last delta goes out at once
                        except TimeoutError:
                            pass
                while not q.empty():
                    items.append(q.get_nowait())
                merged = None
                for item in items:
                    if isinstance(item, BaseException):
                        self.finished = True  # the engine already dropped the request
                        if merged is not None:
                            yield merged
                        raise item
                    merged = item if merged is None else _merge(merged, item)
                self.finished = merged.finished
                yield merged
                if merged.new_text or last_yield is not None:  # until text flows, nothing is held (TTFT)
                    last_yield = loop.time()
        finally:
            self.close()

    def close(self) -> None:
        """Abort the request if it has not finished (idempotent)."""
        if not self.finished:
            self.finished = True
            self._engine.abort(self._req.request_id)


def stream_interval_s(base_s: float, live_streams: int, max_deltas_per_s: float | None) -> float:
    """The least time between two deltas of one stream: `base_s`, stretched under load so that the `live_streams`
    together send at most `max_deltas_per_s` (None: no cap). Tokens per second do not change; each delta carries more
    of them, and the server's cost per delta is paid fewer times."""
    if not max_deltas_per_s:
        return base_s
    return max(base_s, live_streams / max_deltas_per_s)


def _merge(a: RequestOutput, b: RequestOutput) -> RequestOutput:
    """b is newer: keep its cumulative fields and prepend a's delta."""
    return dataclasses.replace(b, new_token_ids=a.new_token_ids + b.new_token_ids, new_text=a.new_text + b.new_text)


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine, thread_nice: int | None = None):
        """`thread_nice`: the engine thread's nice value (lower runs first; below 0 needs CAP_SYS_NICE, and without
        it the thread keeps the default priority). A server's other work (its event loop, Serve's proxy, other
        processes) then preempts the engine less."""
        self.engine = engine
        self.thread_nice = thread_nice
        self._cond = threading.Condition()
        self._inbox: list[tuple] = []
        self._requests: dict[str, _Request] = {}  # engine thread only: admitted, unfinished requests
        self._stopping = False
        self._dead: str | None = None  # why the engine thread stopped
        self._consecutive_failures = 0
        self._trimmed = True  # nothing to give back until a step has run
        self._stats: dict = {}
        self._publish_stats()
        self._thread = threading.Thread(target=self._run, name="llm-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config=None, drafter_factory=None, **overrides) -> AsyncLLMEngine:
        return cls(LLMEngine(config, drafter_factory=drafter_factory, **overrides))

    # ----- the asyncio side ---------------------------------------------------------------------------------------

    async def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None,
                          min_interval_s: float | Callable[[], float] = 0.0) -> RequestStream:
        """Admit a request and return its stream (`min_interval_s`: see RequestStream). Raises what
        LLMEngine.add_request raises (QueueFullError for a full queue, ValueError for a bad prompt or a duplicate
        id), or EngineDeadError."""
        loop = asyncio.get_running_loop()
        req = _Request(request_id, prompt, params or SamplingParams(), loop, loop.create_future())
        self._submit(("add", req))
        try:
            await req.admitted
        except asyncio.CancelledError:
            self.abort(request_id)  # the add may already have happened
            raise
        return RequestStream(self, req, min_interval_s)

    async def generate(self, request_id: str, prompt: str | list[int],
                       params: SamplingParams | None = None) -> AsyncIterator[RequestOutput]:
        """Yield the request's output deltas until it finishes. Cancelling the consumer aborts the request within one
        engine step (its KV blocks and draft context are freed)."""
        stream = await self.add_request(request_id, prompt, params)
        try:
            async for out in stream:
                yield out
        finally:
            stream.close()

    def abort(self, request_id: str) -> None:
        """Stop a request at the start of the next engine iteration (no-op if unknown or finished). Thread-safe."""
        self._submit(("abort", request_id), check_alive=False)

    def stats(self) -> dict:
        """A snapshot published by the engine thread after every iteration (reading the engine here would race)."""
        return dict(self._stats)

    @property
    def is_alive(self) -> bool:
        return self._dead is None and self._thread.is_alive()

    @property
    def dead_reason(self) -> str | None:
        return self._dead if self._dead else (None if self._thread.is_alive() else "engine thread exited")

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine thread; requests still in flight fail with EngineDeadError."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _submit(self, command: tuple, check_alive: bool = True) -> None:
        with self._cond:
            if check_alive and (self._dead or self._stopping):
                raise EngineDeadError(f"the engine is not running: {self._dead or 'shutting down'}")
            self._inbox.append(command)
            self._cond.notify()

    # ----- the engine thread --------------------------------------------------------------------------------------

    def _run(self) -> None:
        set_nice(self.thread_nice)
        try:
            while True:
                with self._cond:
                    while not (self._inbox or self._stopping or self.engine.has_unfinished_requests()):
                        if not self._cond.wait(timeout=IDLE_PUBLISH_S):
                            self._publish_stats()  # idle: the load averages decay, and the published ones follow
                            if not self._trimmed:
                                self._trimmed = release_free_heap()
                    if self._stopping:
                        break
                    commands, self._inbox = self._inbox, []
                for command in commands:
                    self._apply(command)
                if commands:
                    self._publish_stats()  # admissions and aborts show before the (longer) step
                if self.engine.has_unfinished_requests():
                    self._step()
                    self._trimmed = False
                self._publish_stats()
        except BaseException as exc:  # a bug here must not leave requests hanging
            log.exception("engine thread crashed")
            self._dead = f"engine thread crashed: {exc!r}"
        finally:
            with self._cond:
                self._dead = self._dead or "the engine was shut down"
                commands, self._inbox = self._inbox, []
            for command in commands:
                if command[0] == "add":
                    _resolve(command[1], EngineDeadError(self._dead))
            self._fail_all(EngineDeadError(self._dead))
            self._publish_stats()

    def _apply(self, command: tuple) -> None:
        kind, arg = command
        if kind == "add":
            req: _Request = arg
            if req.admitted.done():  # the caller went away before admission (cancelled): nothing to do
                return
            try:
                self.engine.add_request(req.request_id, req.prompt, req.params)
            except Exception as exc:  # QueueFullError, ValueError: the caller's error, not the engine's
                _resolve(req, exc)
                return
            self._requests[req.request_id] = req
            _resolve(req, None)
        elif kind == "abort":
            req = self._requests.pop(arg, None)
            self.engine.abort_request(arg)
            if req is not None:
                _deliver(req, RequestAbortedError(f"request {arg} was aborted"))

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:
            self._consecutive_failures += 1
            log.exception("engine step failed (%d in a row)", self._consecutive_failures)
            self._fail_all(EngineStepError(f"engine step failed: {exc!r}"))
            if self._consecutive_failures >= MAX_CONSECUTIVE_STEP_FAILURES:
                self._dead = f"{self._consecutive_failures} engine steps failed in a row; last: {exc!r}"
                self._stopping = True
            return
        self._consecutive_failures = 0
        for out in outputs:
            req = self._requests.get(out.request_id)
            if req is None:
                continue
            if out.finished:
                del self._requests[out.request_id]
            _deliver(req, out)

    def _fail_all(self, exc: BaseException) -> None:
        requests, self._requests = self._requests, {}
        for rid, req in requests.items():
            try:
                self.engine.abort_request(rid)  # free its blocks if the engine state still allows it
            except Exception:
                pass
            _deliver(req, exc)

    def _publish_stats(self) -> None:
        self._stats = published_stats(self.engine, len(self._requests), self._dead)


def _call(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the consumer's loop is closed: nobody is listening any more
        pass


def _resolve(req: _Request, exc: BaseException | None) -> None:
    def settle():
        if not req.admitted.done():
            if exc is None:
                req.admitted.set_result(None)
            else:
                req.admitted.set_exception(exc)

    _call(req.loop, settle)


def _deliver(req: _Request, item) -> None:
    def put():
        req.queue.put_nowait(item)
        if isinstance(item, BaseException) or item.finished:
            req.ended.set()

    _call(req.loop, put)
