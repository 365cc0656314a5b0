"""EngineProcess: the engine in a child process behind the AsyncLLMEngine interface. Outputs equal the in-process
engine's, admission errors reach the caller, cancelling and aborting free the request in the child, a killed child
fails its requests instead of hanging them, and shutdown leaves no process behind."""
from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from engine import EngineConfig, LLMEngine, QueueFullError, SamplingParams
from engine.async_engine import EngineDeadError, RequestAbortedError
from engine.engine_process import EngineProcess
from tests.helpers import make_tiny_model
from tests.engine.test_async_engine import LONG, reference
from tests.helpers import make_tiny_drafter


@pytest.fixture(scope="module")
def config(tmp_path_factory, default_tokenizer):
    folder = tmp_path_factory.mktemp("engine-process")
    target = make_tiny_model("llama", folder / "target", default_tokenizer)
    drafter = make_tiny_drafter(folder / "drafter", len(default_tokenizer))
    return EngineConfig(model=str(target), dtype="float64", device="cpu", kv_cache_memory_gb=0.05,
                        drafter=str(drafter), speculation="fixed:3", max_num_seqs=2, max_waiting=2,
                        max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def proc(config):
    p = EngineProcess(config, thread_nice=5, torch_threads=1)
    yield p
    p.shutdown()
    assert p._child.poll() is not None  # gone


async def collect(p, rid, prompt, params):
    return [o async for o in p.generate(rid, prompt, params)]


def test_outputs_equal_the_in_process_engine(proc, config):
    """The child sends only what each step added; every output the parent rebuilds from those deltas is whole: the
    prompt ids, everything so far and the logprobs, as the in-process engine's."""
    local = LLMEngine(config)
    params = SamplingParams(max_tokens=24, ignore_eos=True, logprobs=2)
    prompts = ["Once upon a time", [5, 17, 300, 42]]  # at most max_waiting at once
    want = [reference(local, p, params) for p in prompts]

    async def main():
        return await asyncio.gather(*[collect(proc, f"r{i}", p, params) for i, p in enumerate(prompts)])

    got = asyncio.run(main())
    for outs, w in zip(got, want):
        assert outs[-1].finished and all(not o.finished for o in outs[:-1])
        assert [t for o in outs for t in o.new_token_ids] == w.token_ids == outs[-1].token_ids
        assert "".join(o.new_text for o in outs) == w.text == outs[-1].text
        ids, text = [], ""
        for o in outs:
            ids, text = ids + o.new_token_ids, text + o.new_text
            assert o.token_ids == ids and o.text == text and o.prompt_token_ids == w.prompt_token_ids
            assert len(o.logprobs) == len(ids)
        for got_lp, want_lp in zip(outs[-1].logprobs, w.logprobs, strict=True):
            assert got_lp.keys() == want_lp.keys()
            assert [got_lp[t] for t in want_lp] == pytest.approx(list(want_lp.values()), abs=1e-9)
        assert outs[-1].metrics.keys() == w.metrics.keys()
        assert outs[-1].metrics["num_spec_steps"] > 0  # the child drafted with its own drafter
    assert proc.info["speculation"] and proc.info["max_model_len"] == local.max_model_len
    assert os.getpriority(os.PRIO_PROCESS, proc._child.pid) == 5
    stats = proc.stats()
    assert stats["steps"] > 0 and stats["spec"]["draft_rounds"] > 0 and stats["in_flight"] == 0


def test_held_outputs_arrive_whole_in_fewer_messages(config):
    """With an output interval the child holds a step's deltas (not a request's first text, nor its end): the parent
    reads a few messages instead of one per step, and rebuilds the same outputs."""
    local = LLMEngine(config)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    want = reference(local, "Once upon a time", params)
    p = EngineProcess(config, torch_threads=1, output_interval=(30.0, None))
    try:
        outs = asyncio.run(collect(p, "held", "Once upon a time", params))
        steps = p.stats()["steps"]
    finally:
        p.shutdown()
    assert outs[-1].finished and outs[-1].token_ids == want.token_ids and outs[-1].text == want.text
    assert [t for o in outs for t in o.new_token_ids] == want.token_ids
    # the deltas until the first text, then the last one with everything held since
    assert p.output_messages <= 3 < steps


def test_admission_errors_cancel_and_abort(proc):
    async def main():
        with pytest.raises(ValueError):
            await proc.add_request("bad", [], LONG)
        streams = [await proc.add_request(f"q{i}", "Hello", LONG) for i in range(2)]
        deadline = time.monotonic() + 60  # both run before more arrive: admission counts the waiting ones
        while proc.stats()["num_running"] < 2:
            assert time.monotonic() < deadline, proc.stats()
            await asyncio.sleep(0.05)
        streams += [await proc.add_request(f"q{i}", "Hello", LONG) for i in range(2, 4)]  # 2 running + 2 waiting
        with pytest.raises(QueueFullError):
            await proc.add_request("q-full", "Hello", LONG)
        first = streams[0].__aiter__()
        await first.__anext__()
        deadline = time.monotonic() + 60  # the child's in-process drafter holds their contexts, and says so
        while proc.stats()["draft_contexts_live"] < 1:
            assert time.monotonic() < deadline, proc.stats()
            await asyncio.sleep(0.05)
        proc.abort("q0")
        with pytest.raises(RequestAbortedError):
            async for _ in first:
                pass
        for s in streams[1:]:
            s.close()  # leaving a stream aborts its request

    asyncio.run(main())
    deadline = time.monotonic() + 60  # a liveness guard, not a timing: the machine may be loaded
    while any(proc.stats()[k] for k in ("num_running", "num_waiting", "kv_blocks_used", "draft_contexts_live")):
        assert time.monotonic() < deadline, proc.stats()
        time.sleep(0.05)


def test_a_killed_engine_process_fails_its_requests(config):
    p = EngineProcess(config)

    async def main():
        stream = await p.add_request("k", "Hello", LONG)
        it = stream.__aiter__()
        await it.__anext__()
        os.kill(p._child.pid, signal.SIGKILL)
        with pytest.raises(EngineDeadError):
            async for _ in it:
                pass
        with pytest.raises(EngineDeadError):
            await p.add_request("after", "Hello", LONG)

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
        assert not p.is_alive and "exited" in p.dead_reason
    finally:
        p.shutdown()


def test_a_bad_config_fails_at_start(tmp_path):
    with pytest.raises(RuntimeError, match="failed to start"):
        EngineProcess(EngineConfig(model=str(tmp_path / "missing"), device="cpu"))
