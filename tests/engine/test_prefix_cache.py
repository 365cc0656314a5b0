"""Automatic prefix caching: the block manager's hash chain, reference counts and eviction, and an engine whose
outputs (and taps) are those it gives without caching, against transformers' own generate."""
from __future__ import annotations

import random

import pytest
import torch

from engine import LLMEngine, SamplingParams
from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.sequence import Sequence
from tests.helpers import hf_greedy

pytestmark = pytest.mark.usefixtures("kernels")  # each test on the CPU kernels and on the torch ops

BS = 4


def seq(tokens, name="s") -> Sequence:
    return Sequence(name, list(tokens), SamplingParams(), detokenizer=None)


def computed(bm: BlockManager, s: Sequence) -> Sequence:
    """`s` with every token's K/V computed and its full blocks registered, as after the engine's steps."""
    assert bm.allocate(s, s.num_tokens)
    s.num_computed_tokens = s.num_tokens
    bm.cache_full_blocks(s)
    return s


def test_full_blocks_are_found_by_their_whole_prefix():
    bm = BlockManager(16, BS, enable_caching=True)
    a = computed(bm, seq(range(14)))  # 3 full blocks and a partial one
    assert bm.num_cached == 3
    assert bm.match_prefix(seq([*range(12), 99, 98])) == a.block_table[:3]
    assert bm.match_prefix(seq([*range(4), 7, 5, 6, 7, *range(8, 14)])) == a.block_table[:1]  # block 1 differs
    assert bm.match_prefix(seq([*range(4, 8), *range(4)])) == []  # block content alone is not enough: the chain
    # a prompt that is all cached blocks still computes its last token (its logits give the first output token)
    assert bm.match_prefix(seq(range(12))) == a.block_table[:2]
    assert bm.match_prefix(seq(range(13))) == a.block_table[:3]


def test_shared_blocks_are_counted_and_freed_blocks_stay_cached_until_evicted():
    bm = BlockManager(8, BS, enable_caching=True)
    a = computed(bm, seq(range(10)))  # blocks: 2 full (cached) + 1 partial
    b = seq([*range(8), 50, 51, 52])
    hits = bm.match_prefix(b)
    assert hits == a.block_table[:2] and bm.blocks_taken_from_free(hits) == 0
    bm.take_prefix(b, hits)
    assert bm.allocate(b, b.num_tokens)
    assert [bm.ref_counts[x] for x in b.block_table] == [2, 2, 1]
    cached_blocks = b.block_table[:2]
    free_before = bm.num_free
    bm.free(a)
    assert bm.num_free == free_before + 1  # only a's partial block: the shared ones are still b's
    bm.free(b)
    assert bm.num_free == 8 and bm.num_used == 0 and bm.num_cached == 2
    # freed cached blocks are still found, and taking them again shrinks the free list
    c = seq([*range(8), 60])
    hits = bm.match_prefix(c)
    assert hits == cached_blocks and bm.blocks_taken_from_free(hits) == 2
    bm.take_prefix(c, hits)
    assert bm.num_free == 6
    bm.free(c)
    # Eviction: the free list hands out never-cached blocks first, then cached ones, least recently freed first;
    # a handed-out block's content is forgotten.
    hog = seq(range(100, 100 + 7 * BS))
    assert bm.allocate(hog, 6 * BS)
    assert bm.num_cached == 2  # six uncached blocks were free
    assert bm.allocate(hog, 7 * BS)
    assert bm.num_cached == 1
    # a sequence frees its blocks last first, so a chain is evicted from its end: its first block is still found
    assert bm.match_prefix(seq([*range(8), 60])) == cached_blocks[:1]


def test_a_hash_collision_is_not_a_hit():
    bm = BlockManager(8, BS, enable_caching=True)
    a = computed(bm, seq(range(9)))
    block = a.block_table[0]
    bm.block_tokens[block] = (9, 9, 9, 9)  # as if another content had the same hash
    assert bm.match_prefix(seq(range(9))) == []


def test_truncating_into_a_shared_block_gives_it_back():
    bm = BlockManager(8, BS, enable_caching=True)
    a = computed(bm, seq(range(13)))
    b = seq([*range(12), 70])
    bm.take_prefix(b, bm.match_prefix(b))
    assert bm.allocate(b, 13)
    b.num_computed_tokens = 13
    shared = b.block_table[2]
    # b rolls back to 10 tokens: block 2 (tokens 8-11) is cached and a's too, so b must not rewrite it
    assert bm.truncate(b, 10) == 8
    assert b.block_table == a.block_table[:2] and bm.ref_counts[shared] == 1 and len(b.block_hashes) == 2
    assert bm.match_prefix(seq(range(13))) == a.block_table[:3]  # a's cache entries are intact
    # a, alone on its blocks once b is gone, rolls back into block 1: it keeps the block and its cache entry goes
    bm.free(b)
    assert bm.truncate(a, 6) == 6
    assert len(a.block_table) == 2 and len(a.block_hashes) == 1
    assert bm.match_prefix(seq(range(13))) == a.block_table[:1]


def test_caching_off_never_shares():
    bm = BlockManager(8, BS, enable_caching=False)
    computed(bm, seq(range(13)))
    assert bm.num_cached == 0 and bm.match_prefix(seq(range(13))) == []


# ----- the engine -------------------------------------------------------------------------------------------------

def shared_prefix_prompts(n, prefix_len, seed, vocab=49152):
    rng = random.Random(seed)
    prefix = [rng.randrange(3, vocab) for _ in range(prefix_len)]
    return [prefix + [rng.randrange(3, vocab) for _ in range(rng.randint(1, 20))] for _ in range(n)]


def run_all(engine: LLMEngine, prompts, params, one_by_one=False) -> list:
    """Outputs of all prompts; `one_by_one`: the first runs alone (filling the cache) before the rest are added."""
    ids = [f"r{i}-{random.random()}" for i in range(len(prompts))]
    done = {}
    waves = [[0], list(range(1, len(prompts)))] if one_by_one else [list(range(len(prompts)))]
    for wave in waves:
        for i in wave:
            engine.add_request(ids[i], prompts[i], params)
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out
    return [done[r] for r in ids]


def engine_for(tiny_dir, caching: bool, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(tiny_dir), dtype="float64", device="cpu", block_size=16,
                                  enable_prefix_caching=caching, **{"kv_cache_memory_gb": 0.05, **kw}))


def test_cached_prefixes_give_transformers_greedy_output_and_the_same_taps(tiny_dir):
    prompts = shared_prefix_prompts(6, 45, seed=20)  # 2 full blocks shared, the third differs by prompt
    want = hf_greedy(tiny_dir, prompts, 20)
    cached = engine_for(tiny_dir, True, tap_layers=[0, 2])
    plain = engine_for(tiny_dir, False, tap_layers=[0, 2])
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    outs = run_all(cached, prompts, params, one_by_one=True)
    assert [o.token_ids for o in outs] == want
    assert [o.metrics["num_cached_tokens"] for o in outs] == [0] + [32] * 5
    assert cached.counters.prefix_cache_hits == 5 * 32
    assert cached.counters.prefix_cache_queries == sum(map(len, prompts))
    assert cached.block_manager.num_used == 0
    # A sequence admitted from the cache gets the taps it would have computed: restored for the cached blocks.
    for engine in (cached, plain):
        engine.add_request("taps", prompts[3], SamplingParams(max_tokens=2, ignore_eos=True))
        engine.step()  # admitted and prefilled
    got, ref = cached.requests["taps"], plain.requests["taps"]
    assert got.num_cached_tokens == 16 * ((len(prompts[3]) - 1) // 16) and ref.num_cached_tokens == 0  # its own
    assert got.taps.length == ref.taps.length == len(prompts[3])
    torch.testing.assert_close(got.taps.view(), ref.taps.view(), rtol=1e-9, atol=1e-9)


def test_eviction_and_preemption_under_kv_pressure_lose_nothing(tiny_dir):
    # 24 blocks of 16 tokens for 10 requests of ~70 tokens: preemption, and cached blocks evicted to make room.
    prompts = shared_prefix_prompts(10, 40, seed=21)
    want = hf_greedy(tiny_dir, prompts, 30)
    engine = engine_for(tiny_dir, True, kv_cache_memory_gb=24 * 16 * 4 * 2 * 2 * 16 * 8 / 2**30)
    assert engine.block_manager.num_blocks == 24
    outs = run_all(engine, prompts, SamplingParams(max_tokens=30, ignore_eos=True))
    assert [o.token_ids for o in outs] == want
    assert engine.counters.preemptions > 0 and engine.counters.prefix_cache_hits > 0
    assert engine.block_manager.num_used == 0


def test_seeded_sampling_is_the_same_with_and_without_caching(tiny_dir):
    prompts = shared_prefix_prompts(4, 36, seed=22)
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=7, ignore_eos=True)
    on = run_all(engine_for(tiny_dir, True), prompts, params, one_by_one=True)
    off = run_all(engine_for(tiny_dir, False), prompts, params, one_by_one=True)
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    assert sum(o.metrics["num_cached_tokens"] for o in on) == 3 * 32


def test_truncate_into_a_shared_block_then_continue(tiny_dir):
    """A sequence rolled back to inside a cached block that another sequence shares recomputes that block into
    one of its own: both continue as transformers' generate says."""
    engine = engine_for(tiny_dir, True)
    prompt = shared_prefix_prompts(1, 20, seed=23)[0][:20]
    want = hf_greedy(tiny_dir, [prompt], 40)[0]
    engine.add_request("a", prompt, SamplingParams(max_tokens=40, ignore_eos=True))
    a = engine.requests["a"]
    while a.num_computed_tokens < 48:
        engine.step()
    engine.add_request("c", prompt + want[:28], SamplingParams(max_tokens=12, ignore_eos=True))
    engine.step()
    c = engine.requests["c"]
    assert c.num_cached_tokens == 32 and c.block_table[:2] == a.block_table[:2]  # a's prompt and first outputs
    engine.truncate("a", 25)  # into block 1 (tokens 16-31), which c shares
    assert a.num_computed_tokens == 16 and a.block_table == c.block_table[:1]
    outs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                outs[o.request_id] = o.token_ids
    assert outs == {"a": want, "c": want[28:]}
    assert engine.block_manager.num_used == 0


def test_reset_forgets_cached_prefixes(tiny_dir):
    engine = engine_for(tiny_dir, True)
    prompts = shared_prefix_prompts(2, 40, seed=24)
    run_all(engine, prompts[:1], SamplingParams(max_tokens=4))
    engine.reset_prefix_cache()
    assert engine.block_manager.num_cached == 0
    assert run_all(engine, prompts[1:], SamplingParams(max_tokens=4))[0].metrics["num_cached_tokens"] == 0
