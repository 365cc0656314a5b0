"""AsyncLLMEngine: the engine thread, deltas, cancellation, admission errors, step failures, idle sleep."""
from __future__ import annotations

import asyncio
import os
import threading
import time

import psutil
import pytest
import torch

from engine import EngineConfig, LLMEngine, QueueFullError, SamplingParams
from engine.async_engine import (AsyncLLMEngine, EngineDeadError, EngineStepError, RequestAbortedError,
                                 stream_interval_s)
from tests.helpers import make_tiny_drafter, make_tiny_model

LONG = SamplingParams(max_tokens=900, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tmp_path_factory, default_tokenizer):
    folder = tmp_path_factory.mktemp("async")
    target = make_tiny_model("llama", folder / "target", default_tokenizer)
    drafter = make_tiny_drafter(folder / "drafter", len(default_tokenizer))
    eng = LLMEngine(EngineConfig(model=str(target), dtype="float64", device="cpu", kv_cache_memory_gb=0.05,
                                 drafter=str(drafter), speculation="fixed:3", max_num_seqs=2, max_waiting=2,
                                 max_num_batched_tokens=64))
    assert eng.speculator is not None, eng.drafter_error
    return eng


@pytest.fixture
def aengine(engine):
    a = AsyncLLMEngine(engine)
    yield a
    a.shutdown()
    assert engine.block_manager.num_used == 0
    assert not engine.requests


def reference(engine, prompt, params):
    engine.add_request("ref", prompt, params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                return out


async def wait_for(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_generate_streams_deltas_equal_to_the_engine(engine):
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    want = reference(engine, "Hello there", params)
    a = AsyncLLMEngine(engine)

    async def main():
        return [o async for o in a.generate("r", "Hello there", params)]

    try:
        outs = asyncio.run(main())
    finally:
        a.shutdown()
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert all(not o.finished for o in outs[:-1])
    assert [t for o in outs for t in o.new_token_ids] == want.token_ids == outs[-1].token_ids
    assert "".join(o.new_text for o in outs) == want.text
    assert outs[-1].metrics["num_spec_steps"] > 0


def test_min_interval_coalesces_deltas_but_never_holds_the_first_or_the_last(engine):
    """A stream with min_interval_s merges the deltas in between into one, with the same tokens and text; the first
    delta goes out at once and the last as soon as the request finishes. With an interval of an hour, a held delta
    would time the test out: no clock is read."""
    params = SamplingParams(max_tokens=300, ignore_eos=True)
    want = reference(engine, "Hello there", params)  # before the engine thread starts: one stepper at a time
    aengine = AsyncLLMEngine(engine)

    async def main():
        stream = await aengine.add_request("co", "Hello there", params, min_interval_s=3600.0)
        return [out async for out in stream]

    try:
        outs = asyncio.run(asyncio.wait_for(main(), 120))
    finally:
        aengine.shutdown()
    assert len(outs) == 2 and not outs[0].finished and outs[1].finished  # the first at once, then the rest merged
    assert [t for o in outs for t in o.new_token_ids] == want.token_ids
    assert "".join(o.new_text for o in outs) == want.text


def test_a_callable_interval_is_asked_before_every_delta(engine):
    """The server's load-stretched interval: a callable read before each delta. From its second answer on it says an
    hour, so the rest merges into the last delta (no clock is read); tokens and text are unchanged."""
    params = SamplingParams(max_tokens=300, ignore_eos=True)
    want = reference(engine, "Hello there", params)
    aengine = AsyncLLMEngine(engine)
    asked = []

    def interval():
        asked.append(len(asked))
        return 0.0 if len(asked) == 1 else 3600.0

    async def main():
        stream = await aengine.add_request("cb", "Hello there", params, min_interval_s=interval)
        return [out async for out in stream]

    try:
        outs = asyncio.run(asyncio.wait_for(main(), 120))
    finally:
        aengine.shutdown()
    assert len(asked) == 2 and len(outs) == 2 and not outs[0].finished and outs[1].finished
    assert [t for o in outs for t in o.new_token_ids] == want.token_ids
    assert "".join(o.new_text for o in outs) == want.text


def test_stream_interval_stretches_with_the_streams_and_never_shrinks():
    assert stream_interval_s(0.1, 1, 160.0) == 0.1
    assert stream_interval_s(0.1, 16, 160.0) == 0.1
    assert stream_interval_s(0.1, 64, 160.0) == pytest.approx(0.4)  # 64 streams x 2.5 deltas/s = 160 deltas/s
    assert stream_interval_s(0.1, 640, None) == 0.1
    last = 0.0
    for streams in range(0, 300):
        now = stream_interval_s(0.05, streams, 100.0)
        assert now >= max(last, 0.05) and streams / now <= 100.0 + 1e-9
        last = now


def test_cancelling_the_consumer_aborts_within_a_step(aengine, engine):
    async def main():
        seen = asyncio.Event()

        async def consume():
            async for _ in aengine.generate("c", "Hi", LONG):
                seen.set()

        task = asyncio.create_task(consume())
        await seen.wait()
        await wait_for(lambda: aengine.stats()["num_running"] == 1)  # the snapshot follows the outputs
        task.cancel()
        steps = engine.counters.steps
        await wait_for(lambda: aengine.stats()["in_flight"] == 0 and aengine.stats()["kv_blocks_used"] == 0)
        assert engine.counters.steps - steps <= 2  # the abort is applied at the start of the next iteration
        assert engine.speculator.service.stats()["live_contexts"] == 0

    asyncio.run(main())


def test_queue_full_and_bad_prompts_surface_to_the_caller(aengine):
    async def main():
        streams = [await aengine.add_request(f"q{i}", "Hi", LONG) for i in range(4)]  # 2 running + 2 waiting
        await wait_for(lambda: aengine.stats()["num_running"] == 2)
        with pytest.raises(ValueError, match="already in use"):
            await aengine.add_request("q0", "Hi", LONG)
        with pytest.raises(QueueFullError):
            await aengine.add_request("q-full", "Hi", LONG)
        for s in streams:
            s.close()
        await wait_for(lambda: aengine.stats()["in_flight"] == 0 and aengine.stats()["num_waiting"] == 0)
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await aengine.add_request("bad", [10**9], SamplingParams())
        outs = [o async for o in aengine.generate("after", "Hi", SamplingParams(max_tokens=3))]
        assert outs[-1].finished

    asyncio.run(main())


def test_abort_from_outside_ends_the_stream(aengine):
    async def main():
        stream = await aengine.add_request("x", "Hi", LONG)
        it = aiter(stream)
        await anext(it)
        aengine.abort("x")
        with pytest.raises(RequestAbortedError):
            while True:
                await anext(it)

    asyncio.run(main())


def test_a_failing_step_fails_the_requests_instead_of_hanging(aengine, engine, monkeypatch):
    real_step = engine.step
    calls = {"n": 0}

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("boom")
        return real_step()

    monkeypatch.setattr(engine, "step", flaky_step)

    async def main():
        with pytest.raises(EngineStepError, match="boom"):
            async for _ in aengine.generate("f", "Hi", LONG):
                pass
        outs = [o async for o in aengine.generate("ok", "Hi", SamplingParams(max_tokens=4))]  # still serving
        assert outs[-1].finished and aengine.is_alive

    asyncio.run(asyncio.wait_for(main(), 60))


def test_shutdown_fails_pending_requests_and_refuses_new_ones(engine):
    a = AsyncLLMEngine(engine)

    async def main():
        stream = await a.add_request("s", "Hi", LONG)
        it = aiter(stream)
        await anext(it)
        await asyncio.to_thread(a.shutdown)
        with pytest.raises(EngineDeadError):
            while True:
                await anext(it)
        with pytest.raises(EngineDeadError):
            await a.add_request("late", "Hi", LONG)

    asyncio.run(asyncio.wait_for(main(), 60))
    assert not a.is_alive and engine.block_manager.num_used == 0


def test_idle_engine_thread_sleeps(aengine):
    thread = next(t for t in threading.enumerate() if t.name == "llm-engine" and t.is_alive())
    proc = psutil.Process()

    def cpu():
        return next((t.user_time + t.system_time for t in proc.threads() if t.id == thread.native_id), 0.0)

    before = cpu()
    time.sleep(0.5)
    assert cpu() - before < 0.05  # no busy-wait
    stats = aengine.stats()
    assert {"num_running", "num_waiting", "kv_usage", "kv_blocks_used", "steps", "spec", "alive"} <= set(stats)
    assert stats["speculation"] and stats["spec"]["draft_rounds"] > 0 and stats["alive"]


def test_engine_thread_runs_at_the_requested_nice_value(engine):
    a = AsyncLLMEngine(engine, thread_nice=7)  # raising nice needs no privilege
    try:
        thread = next(t for t in threading.enumerate() if t.name == "llm-engine" and t.is_alive())
        deadline = time.monotonic() + 5
        while os.getpriority(os.PRIO_PROCESS, thread.native_id) != 7:
            assert time.monotonic() < deadline, "the engine thread's nice value was not set"
            time.sleep(0.05)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) != 7  # the caller's thread is untouched
    finally:
        a.shutdown()
