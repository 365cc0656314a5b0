"""The "flex" paged attention (engine/attention.py, the GPU's backend) against plain softmax attention, on the CPU.

Eager flex_attention on the CPU scores every key of the cache through the mask_mod and ignores the block mask's
lists, which are what a GPU kernel reads; so the lists are checked on their own: every key a token may see lies in a
block listed for its row, listed once.
"""
from __future__ import annotations

import random

import pytest
import torch

from engine.attention import FLEX_Q_BLOCK, build_metadata, paged_attention

H, HKV, D, BS, NBLOCKS = 6, 2, 32, 16, 96
# (q_len, ctx_len incl. new tokens): decodes, verify segments, a fresh and a continued prefill chunk, a long decode.
SPECS = [(1, 40), (1, 1), (5, 70), (8, 8), (16, 33), (30, 30), (24, 100), (1, 200)]


def make_batch(dtype, seed, specs=SPECS, shared_prefix_blocks=0):
    """Scattered blocks per sequence; the first two sequences share their first `shared_prefix_blocks` blocks (a
    cached prefix), with the same keys and values there."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    free = list(range(NBLOCKS))
    rng.shuffle(free)
    kc = torch.zeros(NBLOCKS, BS, HKV, D, dtype=dtype)
    vc = torch.zeros(NBLOCKS, BS, HKV, D, dtype=dtype)
    tables, keys, values = [], [], []
    for i, (_, L) in enumerate(specs):
        k, v = torch.randn(L, HKV, D, dtype=dtype), torch.randn(L, HKV, D, dtype=dtype)
        table = [free.pop() for _ in range(-(-L // BS))]
        if i == 1 and shared_prefix_blocks:
            n = shared_prefix_blocks * BS
            table[:shared_prefix_blocks] = tables[0][:shared_prefix_blocks]
            k[:n], v[:n] = keys[0][:n], values[0][:n]
        for pos in range(L):
            kc[table[pos // BS], pos % BS] = k[pos]
            vc[table[pos // BS], pos % BS] = v[pos]
        tables.append(table)
        keys.append(k)
        values.append(v)
    return kc, vc, tables, keys, values


def reference(q, keys, values, specs, scale, causal):
    outs, row = [], 0
    for (n, L), k, v in zip(specs, keys, values):
        qs = q[row: row + n].double()
        G = qs.shape[1] // k.shape[1]
        kk, vv = k.double().repeat_interleave(G, dim=1), v.double().repeat_interleave(G, dim=1)
        s = torch.einsum("nhd,lhd->hnl", qs, kk) * scale
        last = (L - n + torch.arange(n)) if causal else torch.full((n,), L - 1)
        p = s.masked_fill(~(torch.arange(L)[None, :] <= last[:, None]), float("-inf")).softmax(-1)
        outs.append(torch.einsum("hnl,lhd->nhd", p, vv).reshape(n, -1))
        row += n
    return torch.cat(outs)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("causal", [True, False])
def test_flex_matches_plain_attention(dtype, causal):
    kc, vc, tables, keys, values = make_batch(dtype, seed=3)
    specs = SPECS if causal else [(min(7, L), L) for _, L in SPECS]  # non-causal: the drafter's blocks of gamma
    meta = build_metadata([(n, L - n, t) for (n, L), t in zip(specs, tables)], BS, H // HKV, torch.device("cpu"),
                          backend="flex", causal=causal, num_cache_blocks=NBLOCKS)
    assert meta.small is None and not meta.prefills
    q = torch.randn(sum(n for n, _ in specs), H, D, dtype=dtype)
    out = paged_attention(q, kc, vc, meta, 0.3)
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(out.double(), reference(q, keys, values, specs, 0.3, causal), rtol=tol, atol=tol)


def test_flex_reads_shared_prefix_blocks_once_per_sequence():
    """Two sequences on one cached prefix: each sees the shared blocks as its own positions."""
    specs = [(1, 40), (1, 17)] + SPECS[2:]  # sequence 1 spans the shared block and one of its own
    kc, vc, tables, keys, values = make_batch(torch.float64, seed=5, specs=specs, shared_prefix_blocks=1)
    assert tables[0][0] == tables[1][0]
    meta = build_metadata([(n, L - n, t) for (n, L), t in zip(specs, tables)], BS, H // HKV, torch.device("cpu"),
                          backend="flex", num_cache_blocks=NBLOCKS)
    q = torch.randn(sum(n for n, _ in specs), H, D, dtype=torch.float64)
    want = reference(q, keys, values, [(n, L) for n, L in specs], 0.3, True)
    torch.testing.assert_close(paged_attention(q, kc, vc, meta, 0.3), want, rtol=1e-10, atol=1e-10)
    check_block_lists(meta.flex, specs, tables, causal=True)


@pytest.mark.parametrize("causal", [True, False])
def test_flex_block_lists_cover_every_visible_key_once(causal):
    specs = [(n if causal else min(7, L), L) for n, L in SPECS]
    specs[1] = (1, 40)  # sequence 1 reads the two shared blocks
    _, _, tables, _, _ = make_batch(torch.float32, seed=7, specs=specs, shared_prefix_blocks=2)
    meta = build_metadata([(n, L - n, t) for (n, L), t in zip(specs, tables)], BS, H // HKV, torch.device("cpu"),
                          backend="flex", causal=causal, num_cache_blocks=NBLOCKS)
    check_block_lists(meta.flex, specs, tables, causal)


@pytest.mark.parametrize("causal", [True, False])
def test_compiled_flex_reads_the_listed_blocks_and_matches(causal):
    """flex_attention compiled as on a GPU (inductor's CPU kernel here), which loads only the blocks the mask lists:
    it matches plain attention, and drops keys when a listed block is taken off."""
    from engine.attention import _flex_attention

    kc, vc, tables, keys, values = make_batch(torch.float32, seed=9)
    specs = SPECS if causal else [(min(7, L), L) for _, L in SPECS]
    meta = build_metadata([(n, L - n, t) for (n, L), t in zip(specs, tables)], BS, H // HKV, torch.device("cpu"),
                          backend="flex", causal=causal, num_cache_blocks=NBLOCKS)
    q = torch.randn(sum(n for n, _ in specs), H, D)
    k = kc.view(1, NBLOCKS * BS, HKV, D).transpose(1, 2)
    v = vc.view(1, NBLOCKS * BS, HKV, D).transpose(1, 2)
    compiled = _flex_attention(True)

    def attend():
        o = compiled(q.transpose(0, 1)[None], k, v, block_mask=meta.flex, scale=0.3, enable_gqa=True)
        return o[0].transpose(0, 1).reshape(q.shape[0], -1)

    out = attend()
    torch.testing.assert_close(out.double(), reference(q, keys, values, specs, 0.3, causal), rtol=2e-5, atol=2e-5)
    meta.flex.kv_num_blocks[..., 0] -= 1  # the first row's last listed block, which its tokens see
    assert (attend() - out)[:FLEX_Q_BLOCK].abs().max() > 1e-3


def check_block_lists(mask, specs, tables, causal):
    nums = mask.kv_num_blocks[0, 0].tolist()
    rows = [r[:n] for r, n in zip(mask.kv_indices[0, 0].tolist(), nums)]
    token = 0
    needed: list[set[int]] = [set() for _ in rows]
    for (n, L), table in zip(specs, tables):
        for i in range(n):
            last = L - n + i if causal else L - 1
            needed[token // FLEX_Q_BLOCK].update(table[p // BS] for p in range(last + 1))
            token += 1
    assert len(rows) == -(-token // FLEX_Q_BLOCK)
    for row, need in zip(rows, needed):
        assert len(row) == len(set(row)), "a block listed twice would count its keys twice"
        assert need <= set(row), f"blocks {need - set(row)} are visible but not listed"
        assert set(row) <= need, "a listed block nobody in the row can see is wasted work"


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown attention backend"):
        build_metadata([(1, 0, [0])], BS, 1, torch.device("cpu"), backend="flash")


# ----- the engine and the drafter on the flex backend ---------------------------------------------------------------

@pytest.fixture
def flex_backend(monkeypatch):
    """Engines built inside the test attend with flex_attention (engine.ops.Ops reads DSPARK_ATTENTION), as on a GPU."""
    monkeypatch.setenv("DSPARK_ATTENTION", "flex")


def test_engine_on_flex_matches_generate(flex_backend, tiny_dir):
    """Chunked prefills, decodes and requests joining mid-flight, with a shared prompt prefix from the prefix cache."""
    from engine import EngineConfig, LLMEngine, SamplingParams
    from tests.helpers import hf_greedy

    engine = LLMEngine(EngineConfig(model=str(tiny_dir), dtype="float64", device="cpu", kv_cache_memory_gb=0.01,
                                    max_num_batched_tokens=64))
    assert engine.model.ops.attention == "flex" and engine.kv_cache.k[0].shape[1:] == engine.kv_cache.v[0].shape[1:]
    rng = random.Random(11)
    shared = [rng.randrange(3, 49152) for _ in range(40)]
    prompts = [shared + [rng.randrange(3, 49152) for _ in range(rng.randint(1, 30))] for _ in range(4)]
    prompts += [[rng.randrange(3, 49152) for _ in range(rng.randint(1, 120))] for _ in range(4)]
    want = hf_greedy(tiny_dir, prompts, 16)
    done, pending, step = {}, list(enumerate(prompts)), 0
    while pending or engine.has_unfinished_requests():
        if pending and step % 2 == 0:
            i, p = pending.pop(0)
            engine.add_request(f"f{i}", p, SamplingParams(max_tokens=16, ignore_eos=True))
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
        step += 1
    assert [done[f"f{i}"] for i in range(len(prompts))] == want
    assert engine.block_manager.num_used == 0


def test_speculation_on_flex_equals_plain_decoding_float64(flex_backend, tmp_path, default_tokenizer):
    """Verify segments in the target and the drafter's non-causal blocks in its context cache, both on flex."""
    from engine import EngineConfig, LLMEngine, SamplingParams
    from tests.engine.test_speculative import make_predictable_target, random_prompts, run, train_drafter

    target_dir = make_predictable_target(tmp_path / "target", default_tokenizer)
    drafter_dir = train_drafter(target_dir, tmp_path)
    common = dict(model=str(target_dir), dtype="float64", device="cpu", kv_cache_memory_gb=0.05)
    plain = LLMEngine(EngineConfig(**common))
    spec = LLMEngine(EngineConfig(**common, drafter=str(drafter_dir), speculation="fixed:5"))
    assert spec.speculator is not None, spec.drafter_error
    assert spec.model.ops.attention == "flex"
    prompts = random_prompts(8, seed=2)
    params = [SamplingParams(max_tokens=20 + 5 * (i % 3), ignore_eos=True) for i in range(len(prompts))]
    want = [o.token_ids for o in run(plain, prompts, params)]
    assert [o.token_ids for o in run(spec, prompts, params, join_every=2)] == want
    c = spec.speculator.counters
    assert c.drafts > 0 and c.draft_tokens > c.accepted_tokens > 0, c


def test_flex_self_check_passes_here_and_backends_are_picked_as_documented(monkeypatch):
    from engine.attention import flex_unavailable
    from engine.ops import Ops

    assert flex_unavailable("cpu") is None  # the check a GPU runs before it picks flex, here on eager flex
    cpu = torch.device("cpu")
    assert Ops(cpu, kernels=False).attention == "sdpa"  # the CPU without kernels
    monkeypatch.setenv("DSPARK_ATTENTION", "flex")
    assert Ops(cpu).attention == "flex" and Ops(cpu).key_layout(torch.float32) == "plain"
    monkeypatch.setenv("DSPARK_ATTENTION", "sdpa")
    assert Ops(cpu).attention == "sdpa"
    monkeypatch.setenv("DSPARK_ATTENTION", "flash")
    with pytest.raises(ValueError, match="DSPARK_ATTENTION"):
        Ops(cpu)
