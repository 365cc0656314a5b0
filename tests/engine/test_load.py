"""The load signal: per-step records and the averages a replica publishes."""
from __future__ import annotations

import time

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.load import IDLE_TICK_S, LoadMonitor, StepLoad


def test_averages_follow_the_steps_and_decay_when_idle():
    mon = LoadMonitor(alpha=0.5)
    busy = StepLoad(running=48, waiting=7, max_num_seqs=64, tokens=96, token_budget=128, decoding=48, eligible=48,
                    drafted=0, verify_tokens=0)
    for _ in range(30):
        mon.observe(busy)
    sig = mon.signals(kv_usage=0.4)
    assert sig["queue_depth"] == 7 and sig["running"] == 48 and sig["kv_usage"] == 0.4
    assert sig["seq_occupancy"] == pytest.approx(0.75) and sig["token_occupancy"] == pytest.approx(0.75)
    assert sig["spec_squeezed"] == pytest.approx(1.0)  # speculation possible, nothing verified
    time.sleep(IDLE_TICK_S * 40)
    rested = mon.signals(kv_usage=0.4)  # an idle replica is neither occupied nor squeezed
    assert rested["spec_squeezed"] < 0.01 and rested["seq_occupancy"] < 0.01
    for _ in range(30):
        mon.observe(busy)
    light = StepLoad(running=2, max_num_seqs=64, tokens=10, token_budget=128, decoding=2, eligible=2, drafted=2,
                     verify_tokens=8)
    for _ in range(30):
        mon.observe(light)
    sig = mon.signals(kv_usage=0.1)
    assert sig["spec_squeezed"] == pytest.approx(0.0, abs=1e-6)
    assert sig["verify_tokens_per_seq"] == pytest.approx(4.0) and sig["verify_tokens_per_step"] == pytest.approx(8)
    assert all(isinstance(v, float) for v in sig.values())
    time.sleep(IDLE_TICK_S * 30)
    idle = mon.signals(kv_usage=0.0)
    assert idle["seq_occupancy"] < 0.01 and idle["token_occupancy"] < 0.01


def test_engine_publishes_its_step_load(tiny_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_dir), dtype="float32", device="cpu", kv_cache_memory_gb=0.02,
                                    max_num_seqs=4, max_num_batched_tokens=64))
    for i in range(6):
        engine.add_request(f"r{i}", list(range(10, 30)), SamplingParams(max_tokens=8, ignore_eos=True))
    engine.step()
    last = engine.load.last
    # 3 prompts of 20 tokens and a 4-token chunk of the 4th fill the 64-token budget; 3 of them emit a token.
    assert last.running == 4 and last.waiting == 2
    assert last.tokens == 64 and last.decoding == 3
    assert last.kv_tokens == 0  # fresh prompts read no cached context
    engine.step()
    # The 3 decoding sequences read their 20 cached tokens each, the 4th prompt its first 4-token chunk.
    assert engine.load.last.kv_tokens == 3 * 20 + 4 and engine.load.last.waiting == 2
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats()["load"]["queue_depth"] == 0.0
