"""LLMEngine in a process of its own (as vLLM v1's EngineCore), behind the AsyncLLMEngine interface.

Why: in a Serve replica the engine thread shares its process, and so the GIL, with the event loops that run Python
for every request and streamed delta. On a few CPU cores that made each step measurably slower than the same step in
a plain loop. Here the engine steps in a child process with nothing else in it; the server's process keeps the asyncio
side (admission, per-request streams) and one reader thread that blocks on the pipe.

Protocol, over one multiprocessing connection (pickled tuples):
    parent -> child   ("add", rid, prompt, params) | ("abort", rid) | ("draft_at", where) | ("draft_gone", message)
                      | ("stop",)
    child -> parent   ("ready", info) | ("start_failed", message) | ("admitted", rid, exception or None)
                      | ("outputs", [OutputDelta], stats) | ("step_failed", [rid], message) | ("stats", stats)
                      | ("draft_lost",) | ("dead", reason)
A delta carries what a step added to a request's RequestOutput (new tokens, text and logprobs; the prompt ids once);
the parent keeps what came before. Whole outputs would pickle every token so far, every step, a cost that grows with
the length; deltas, rebuilt included, cost little and hardly grow. With `output_interval` the child sends its held
deltas only as often as the streams send them on anyway (stream_interval_s), and at once when a request finishes or
has yet to show text: each message wakes the parent, and on a few cores a wake-up stalls the engine's threads.
The child's drafter comes from `connect_drafter`, a picklable callable its caller passes in (deployments/server.py:
a DraftServiceProxy connected straight to the replica's draft actor over its socket); when that link breaks, the child
asks the parent (which has Ray) where the restarted actor listens.
"""
from __future__ import annotations

import logging
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import NamedTuple

import torch

from engine.async_engine import (IDLE_PUBLISH_S, MAX_CONSECUTIVE_STEP_FAILURES, AsyncLLMEngine, EngineDeadError,
                                 EngineStepError, RequestAbortedError, _deliver, _Request, _resolve, engine_info,
                                 published_stats, release_free_heap, set_nice, stream_interval_s)
from engine.drafter import Drafter
from engine.llm_engine import LLMEngine, RequestOutput

log = logging.getLogger(__name__)


class OutputDelta(NamedTuple):
    """What a step added to a request's RequestOutput (the child side of the "outputs" message)."""

    request_id: str
    prompt_token_ids: list[int] | None  # in the request's first delta only
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None
    metrics: dict
    logprobs: list | None  # of the new tokens

    @classmethod
    def of(cls, out: RequestOutput, with_prompt: bool) -> "OutputDelta":
        n_new = len(out.new_token_ids)
        logprobs = None if out.logprobs is None else out.logprobs[len(out.token_ids) - n_new:]
        return cls(out.request_id, out.prompt_token_ids if with_prompt else None, out.new_token_ids, out.new_text,
                   out.finished, out.finish_reason, out.metrics, logprobs)


@dataclass
class _SoFar:
    """A request's output so far, rebuilt by the parent from its deltas."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str = ""
    logprobs: list | None = None

    def apply(self, d: OutputDelta) -> RequestOutput:
        self.token_ids.extend(d.new_token_ids)
        self.text += d.new_text
        if d.logprobs is not None:
            self.logprobs = self.logprobs or []
            self.logprobs.extend(d.logprobs)
        # Snapshots, as the in-process engine gives: a consumer may hold an output while later ones arrive.
        return RequestOutput(d.request_id, self.prompt_token_ids, list(self.token_ids), self.text, d.new_token_ids,
                             d.new_text, d.finished, d.finish_reason, d.metrics,
                             None if self.logprobs is None else list(self.logprobs))


class EngineProcess(AsyncLLMEngine):
    """`EngineProcess(config, connect_drafter=None, draft_actor=None, ...)`: starts the child, waits until its
    engine is loaded, and then behaves as AsyncLLMEngine (add_request, generate, abort, stats, is_alive, dead_reason,
    shutdown). `info` holds what a server needs from the engine object itself (max_model_len, vocab_size,
    speculation, drafter_error)."""

    def __init__(self, config, connect_drafter: Callable[[_ParentLocator], Drafter] | None = None, draft_actor=None,
                 thread_nice: int | None = None, torch_threads: int | None = None, drafter_error: str | None = None,
                 startup_timeout_s: float = 600.0, output_interval: tuple[float, float | None] | None = None):
        """`connect_drafter`: a picklable callable that the child calls with its locator (see _ParentLocator) to get
        the engine's drafter; `draft_actor`: the Ray actor behind it, which this process pings for the child after a
        failure. None: the engine loads `config.drafter` itself, or runs without one. `drafter_error`: why a drafter
        that was asked for is missing (reported in stats). `output_interval`: (base_s, max_deltas_per_s) of
        stream_interval_s, the least time between two "outputs" messages that carry no urgent delta; None: every
        step."""
        self.draft_actor = draft_actor
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # guards _requests: the asyncio side adds, the reader thread delivers
        self._requests: dict[str, _Request] = {}
        self._so_far: dict[str, _SoFar] = {}  # touched by the reader thread only
        self._dead: str | None = None
        self._stopping = False
        self._stats: dict = {}
        self.output_messages = 0  # "outputs" messages read from the child
        ours, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._child = subprocess.Popen([sys.executable, "-m", "engine.engine_process", str(theirs.fileno())],
                                       env=env, pass_fds=[theirs.fileno()])
        theirs.close()
        self._conn = Connection(ours.detach())
        # Plain pickle: Connection.send would ship a tensor (the draft vocabulary) as a shared-memory handle.
        self._conn.send_bytes(pickle.dumps((config, connect_drafter, thread_nice, torch_threads, drafter_error,
                                            output_interval)))
        if not self._conn.poll(startup_timeout_s):
            self._child.kill()
            raise RuntimeError(f"the engine process did not start within {startup_timeout_s} s")
        try:
            kind, payload = self._conn.recv()
        except EOFError:
            kind, payload = "start_failed", f"it exited ({self._child.wait(timeout=10)})"
        if kind != "ready":
            self._child.wait(timeout=10)
            raise RuntimeError(f"the engine process failed to start: {payload}")
        self.info: dict = payload["info"]
        self._stats = payload["stats"]
        self._reader = threading.Thread(target=self._read, name="engine-process-reader", daemon=True)
        self._reader.start()

    # ----- the asyncio side (AsyncLLMEngine's add_request, generate and abort call _submit) -----------------------

    def _submit(self, command: tuple, check_alive: bool = True) -> None:
        kind, arg = command
        if check_alive and (self._dead or self._stopping):
            raise EngineDeadError(f"the engine is not running: {self._dead or 'shutting down'}")
        if kind == "add":
            with self._lock:
                self._requests[arg.request_id] = arg
            self._send(("add", arg.request_id, arg.prompt, arg.params))
        else:  # abort: the consumer stops now; outputs still in flight for it are dropped
            with self._lock:
                req = self._requests.pop(arg, None)
            if req is not None and req.admitted.done():
                _deliver(req, RequestAbortedError(f"request {arg} was aborted"))
            self._send(("abort", arg))

    def _send(self, message: tuple) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except (OSError, EOFError, ValueError):  # the child is gone: the reader reports it
            pass

    def stats(self) -> dict:
        return dict(self._stats)

    @property
    def pid(self) -> int:
        return self._child.pid

    @property
    def is_alive(self) -> bool:
        return self._dead is None and self._child.poll() is None

    @property
    def dead_reason(self) -> str | None:
        if self._dead:
            return self._dead
        return None if self._child.poll() is None else f"engine process exited ({self._child.returncode})"

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._send(("stop",))
        try:
            self._child.wait(timeout)
        except subprocess.TimeoutExpired:
            self._child.kill()
        if self._reader is not threading.current_thread():
            self._reader.join(timeout)

    # ----- the reader thread --------------------------------------------------------------------------------------

    def _read(self) -> None:
        try:
            while True:
                try:
                    message = self._conn.recv()
                except (EOFError, OSError):
                    self._dead = self._dead or ("the engine was shut down" if self._stopping
                                                else f"engine process exited ({self._child.wait()})")
                    break
                self._handle(message)
        except BaseException as exc:  # a bug here must not leave requests hanging
            log.exception("engine process reader crashed")
            self._dead = f"engine process reader crashed: {exc!r}"
        finally:
            self._fail_all(EngineDeadError(self._dead or "the engine stopped"))
            self._stats = {**self._stats, "alive": False, "dead_reason": self._dead}
            self._conn.close()

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "outputs":
            _, deltas, stats = message
            self.output_messages += 1
            self._stats = stats  # before the outputs: a consumer that sees its last delta sees this step's stats
            for delta in deltas:
                rid = delta.request_id
                so_far = self._so_far.get(rid)
                if so_far is None:
                    so_far = self._so_far[rid] = _SoFar(delta.prompt_token_ids, [])
                out = so_far.apply(delta)
                with self._lock:
                    req = self._requests.get(rid)
                    if req is not None and delta.finished:
                        del self._requests[rid]
                if req is None or delta.finished:  # aborted, or done: nothing more to rebuild
                    del self._so_far[rid]
                if req is not None:
                    _deliver(req, out)
        elif kind == "admitted":
            _, rid, exc = message
            with self._lock:
                req = self._requests.get(rid) if exc is None else self._requests.pop(rid, None)
            if req is not None:
                _resolve(req, exc)
        elif kind == "stats":
            self._stats = message[1]
        elif kind == "step_failed":
            _, rids, text = message
            for rid in rids:
                self._so_far.pop(rid, None)
                with self._lock:
                    req = self._requests.pop(rid, None)
                if req is not None:
                    _deliver(req, EngineStepError(text))
        elif kind == "dead":
            self._dead = message[1]
        elif kind == "draft_lost":
            threading.Thread(target=self._locate_draft_actor, daemon=True).start()

    def _locate_draft_actor(self) -> None:
        import ray  # only a replica with a draft actor gets here; the engine itself never needs Ray

        try:  # retried by Ray while the actor restarts
            where = ray.get(self.draft_actor.ping.options(max_task_retries=-1).remote())
            self._send(("draft_at", where))
        except Exception as exc:
            self._send(("draft_gone", repr(exc)))

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            requests, self._requests = self._requests, {}
        for req in requests.values():
            if req.admitted.done():
                _deliver(req, exc)
            else:
                _resolve(req, exc)


# ----- the child ----------------------------------------------------------------------------------------------------


class _ParentLocator:
    """The child's way back to a restarted draft actor: the parent pings it through Ray (DraftServiceProxy in
    draft_service/actor.py calls `start` when its link breaks, then `poll` until the actor answers)."""

    def __init__(self, send):
        self.send = send
        self.where: dict | None = None
        self.gone: str | None = None

    def start(self) -> None:
        self.where = self.gone = None
        self.send(("draft_lost",))

    def poll(self) -> dict | None:
        if self.gone:
            raise RuntimeError(self.gone)
        where, self.where = self.where, None
        return where


def _child_main(fd: int) -> None:
    conn = Connection(fd)
    config, connect_drafter, thread_nice, torch_threads, drafter_error, output_interval = pickle.loads(
        conn.recv_bytes())
    set_nice(thread_nice)  # first, so that torch's worker threads inherit it
    if torch_threads:
        torch.set_num_threads(torch_threads)
    locator = _ParentLocator(conn.send)
    try:
        drafter = connect_drafter(locator) if connect_drafter is not None else None
        engine = LLMEngine(config, drafter_factory=None if drafter is None else lambda target: drafter)
        if drafter_error:
            engine.drafter_error = drafter_error
    except BaseException as exc:
        conn.send(("start_failed", f"{type(exc).__name__}: {exc}"))
        return
    core = _Core(engine, conn, locator, output_interval)
    conn.send(("ready", {"info": engine_info(engine), "stats": core.stats()}))
    core.run()


class _Core:
    """The child's loop: apply the parent's commands, step, send the outputs and the stats."""

    def __init__(self, engine, conn: Connection, locator: _ParentLocator,
                 output_interval: tuple[float, float | None] | None = None):
        self.engine, self.conn, self.locator = engine, conn, locator
        self.output_interval = output_interval
        self.live: set[str] = set()  # admitted, unfinished
        self.prompt_unsent: set[str] = set()  # admitted, no output sent yet (the first delta carries the prompt)
        self.textless: set[str] = set()  # admitted, no text sent yet (until then every delta goes out at once)
        self.held: list[OutputDelta] = []  # deltas not sent yet
        self.last_sent = 0.0
        self.failures = 0
        self.stopping = False
        self.trimmed = True

    def stats(self) -> dict:
        return published_stats(self.engine, len(self.live), None)

    def run(self) -> None:
        try:
            while not self.stopping:
                busy = self.engine.has_unfinished_requests()
                if self.conn.poll(0 if busy else IDLE_PUBLISH_S):
                    while not self.stopping and self.conn.poll():
                        self.apply(self.conn.recv())
                elif not busy:
                    if self.held:
                        self.send_outputs()
                    self.conn.send(("stats", self.stats()))  # idle: the load averages decay
                    if not self.trimmed:
                        self.trimmed = release_free_heap()
                    continue
                if self.engine.has_unfinished_requests() and not self.stopping:
                    self.step()
        except (EOFError, OSError):
            return  # the parent is gone
        except BaseException as exc:
            log.exception("engine process crashed")
            try:
                self.conn.send(("dead", f"engine process crashed: {exc!r}"))
            except OSError:
                pass

    def apply(self, message: tuple) -> None:
        kind = message[0]
        if kind == "add":
            _, rid, prompt, params = message
            try:
                self.engine.add_request(rid, prompt, params)
            except Exception as exc:  # QueueFullError, ValueError: the caller's error, not the engine's
                self.conn.send(("admitted", rid, exc))
                return
            self.live.add(rid)
            self.prompt_unsent.add(rid)
            self.textless.add(rid)
            self.conn.send(("admitted", rid, None))
        elif kind == "abort":
            self.live.discard(message[1])
            self.prompt_unsent.discard(message[1])
            self.textless.discard(message[1])
            self.engine.abort_request(message[1])
        elif kind == "draft_at":
            self.locator.where = message[1]
        elif kind == "draft_gone":
            self.locator.gone = message[1]
        elif kind == "stop":
            self.stopping = True

    def step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:
            self.failures += 1
            log.exception("engine step failed (%d in a row)", self.failures)
            failed, self.live = list(self.live), set()
            self.prompt_unsent -= set(failed)
            self.textless -= set(failed)
            self.held = []  # all of their requests' (a finished one's delta went out at once)
            for rid in failed:
                try:
                    self.engine.abort_request(rid)
                except Exception:
                    pass
            self.conn.send(("step_failed", failed, f"engine step failed: {exc!r}"))
            if self.failures >= MAX_CONSECUTIVE_STEP_FAILURES:
                self.conn.send(("dead", f"{self.failures} engine steps failed in a row; last: {exc!r}"))
                self.stopping = True
            return
        self.failures = 0
        self.trimmed = False
        urgent = False
        for out in outputs:
            rid = out.request_id
            first = rid in self.prompt_unsent
            if first:
                self.prompt_unsent.discard(rid)
            if rid in self.textless:
                urgent = True
                if out.new_text:
                    self.textless.discard(rid)
            if out.finished:
                self.live.discard(rid)
                self.textless.discard(rid)
                urgent = True
            self.held.append(OutputDelta.of(out, first))
        if urgent or self.output_interval is None or (
                time.monotonic() - self.last_sent >= stream_interval_s(self.output_interval[0], len(self.live),
                                                                   self.output_interval[1])):
            self.send_outputs()

    def send_outputs(self) -> None:
        self.conn.send(("outputs", self.held, self.stats()))
        self.held = []
        self.last_sent = time.monotonic()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s engine-process %(levelname)s %(message)s")
    # From the module, not this __main__ copy: the OutputDeltas it pickles must name engine.engine_process.
    from engine.engine_process import _child_main as child_main

    child_main(int(sys.argv[1]))
