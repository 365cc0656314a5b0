"""Deterministic mode (EngineConfig.deterministic): batch-invariant kernels, so a token's logits are the same bits
whatever else the step holds, and a greedy answer never depends on the batch, on prefill chunking or on speculation.

Each kernel test also runs the default mode's path, to show that the comparison would see a difference there."""
from __future__ import annotations

import random
import sys

import pytest
import torch

from engine.attention import build_metadata, paged_attention
from engine.ops import cpu_kernels

KERNELS = cpu_kernels() is not None and cpu_kernels().has_linear_small()
pytestmark = pytest.mark.skipif(not KERNELS, reason="the CPU kernels (AVX2 + FMA or AVX-512) could not be built")


def _weights(kind: str, N: int, K: int, gen) -> tuple[torch.Tensor, torch.dtype]:
    """(weight, activation dtype) for each weight format Linear keeps for the kernel."""
    w = torch.randn(N, K, generator=gen) / K ** 0.5
    if kind == "fp32":  # values bf16 cannot hold: the plain fp32 weight
        return w, torch.float32
    if kind == "bf16_exact_fp32":  # held as bf16 tiles, widened on load
        return w.bfloat16().float(), torch.float32
    if kind == "q8":  # Q8_0 values: held as int8 and one scale per 32
        d = (w.abs().reshape(N, K // 32, 32).amax(-1) / 127).half().float()
        q = torch.randint(-127, 128, (N, K // 32, 32), generator=gen).float()
        q[..., 0] = 127  # Q8_0 scales each block by its largest magnitude
        return (q * d[..., None]).reshape(N, K), torch.float32
    return w.bfloat16(), torch.bfloat16


@pytest.mark.parametrize("kind", ["fp32", "bf16_exact_fp32", "q8", "bf16"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("N", [101, 128])
def test_a_linear_row_is_the_same_bits_for_1_to_96_rows(kind, with_bias, N):
    from engine.model import Linear, tile_bf16

    gen = torch.Generator().manual_seed(0)
    K = 512  # long enough sums that roundings differ by path; N = 101 leaves a tail after every group of outputs
    w, dtype = _weights(kind, N, K, gen)
    b = torch.randn(N, generator=gen).to(w.dtype) if with_bias and kind != "q8" else None
    x = torch.randn(96, K, generator=gen).to(dtype)
    lin = Linear(w, b, invariant=True)
    if kind == "bf16" and cpu_kernels().has_linear_bf16():  # vdpbf16ps chains over the weight's bf16 tiles
        assert lin._panels is None and torch.equal(lin._small_weight, tile_bf16(w))  # plain where N does not tile
    else:
        held = {"fp32": torch.float32, "bf16_exact_fp32": torch.bfloat16, "q8": torch.int8, "bf16": torch.bfloat16}
        assert lin._panels[0].dtype == held[kind]  # the fewest bytes that hold the values exactly
    full = lin(x)
    assert full.shape == (96, N) and full.dtype == dtype
    torch.testing.assert_close(full.double(), x.double() @ w.double().T + (0 if b is None else b.double()),
                               rtol=2e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-4)
    for m in range(1, 97):
        assert torch.equal(lin(x[:m].contiguous()), full[:m]), f"{m} rows"
    assert torch.equal(lin(x[5:6]), full[5:6])
    assert torch.equal(lin(x.view(8, 12, K)), full.view(8, 12, N))  # any leading shape, any stride
    # The default mode switches kernels by row count (linear_small up to 8 rows, then oneDNN or F.linear). In bf16
    # the output's one rounding hides most such differences at a single layer (not over a model's 30).
    default = Linear(w, b)
    assert dtype == torch.bfloat16 or not all(torch.equal(default(x[:m].contiguous()), default(x)[:m])
                                              for m in (1, 4, 8, 9, 16, 64))


def _cache(dtype, lengths, H=6, Hkv=2, D=32, bs=16, seed=0):
    """A transposed-K cache holding random K/V for sequences of `lengths`, in scattered blocks."""
    gen, rng = torch.Generator().manual_seed(seed), random.Random(seed)
    nblocks = sum(-(-L // bs) for L in lengths) + 3
    free = list(range(nblocks))
    rng.shuffle(free)
    kc = torch.zeros(nblocks, Hkv, D, bs, dtype=dtype)
    vc = torch.zeros(nblocks, bs, Hkv, D, dtype=dtype)
    tables = []
    for L in lengths:
        table = [free.pop() for _ in range(-(-L // bs))]
        for pos in range(L):
            kc[table[pos // bs], :, :, pos % bs] = torch.randn(Hkv, D, generator=gen).to(dtype)
            vc[table[pos // bs], pos % bs] = torch.randn(Hkv, D, generator=gen).to(dtype)
        tables.append(table)
    return kc, vc, tables


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_attention_row_is_the_same_bits_as_decode_verify_prefill_or_in_a_batch(dtype):
    H, D, bs = 6, 32, 16
    L = 70  # the sequence under test; its last 40 positions are queried
    kc, vc, (table, other) = _cache(dtype, [L, 45])
    q = torch.randn(40, H, D, generator=torch.Generator().manual_seed(1)).to(dtype)  # positions 30 .. 69
    k = cpu_kernels()

    def attend(segments, queries):  # segments: (q_len, cached before, table), queries in packed order
        meta = build_metadata(segments, bs, 3, torch.device("cpu"), backend="kernel", small_query=sys.maxsize)
        return paged_attention(queries, kc, vc, meta, 0.17, k)

    prefill = attend([(40, 30, table)], q)
    decode = torch.cat([attend([(1, 30 + i, table)], q[i: i + 1]) for i in range(40)])
    assert torch.equal(prefill, decode)
    for n in (2, 3, 5, 8):  # verify segments ending at the last position
        assert torch.equal(attend([(n, L - n, table)], q[40 - n:]), decode[40 - n:])
    q_other = torch.randn(3, H, D).to(dtype)
    mixed = attend([(3, 42, other), (8, L - 8, table)], torch.cat([q_other, q[32:]]))
    assert torch.equal(mixed[3:], decode[32:])


PROMPTS = [
    "Explain how a bicycle stays upright.", "Write a haiku about rain on a tin roof.",
    "List three uses of baking soda.", "What is the capital of Australia, and why not Sydney?",
    "Summarise the plot of Hamlet in two sentences.", "Give me a Python one-liner that reverses a string.",
    "Why is the sky blue?", "Describe a sunrise to someone who has never seen one.",
]


def _chat(tokenizer, n: int) -> list[list[int]]:
    """n chat prompts of mixed lengths: PROMPTS, then longer ones built from them."""
    texts = [PROMPTS[i % len(PROMPTS)] + " Also, in one line: " + PROMPTS[(3 * i + 1) % len(PROMPTS)] * (i % 4)
             if i >= len(PROMPTS) else PROMPTS[i] for i in range(n)]
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                               tokenize=True, return_dict=True)["input_ids"]) for t in texts]


def _run(engine, prompts, params, join_after: int | None = None) -> list[tuple[list[int], list]]:
    """(tokens, logprobs) per prompt, all submitted at once, or the second half once the first has decoded
    `join_after` steps (their prefill chunks then run beside the first half's decodes)."""
    from engine import SamplingParams  # noqa: F401 - params come in built

    ids = [f"r{i}-{random.random()}" for i in range(len(prompts))]
    late = len(prompts) // 2 if join_after is not None else len(prompts)
    for rid, p, sp in zip(ids[:late], prompts[:late], params[:late]):
        engine.add_request(rid, p, sp)
    results, steps = {}, 0
    while len(results) < len(ids):
        steps += 1
        if join_after is not None and steps == join_after:
            for rid, p, sp in zip(ids[late:], prompts[late:], params[late:]):
                engine.add_request(rid, p, sp)
        for out in engine.step():
            if out.finished:
                results[out.request_id] = (out.token_ids, out.logprobs)
    return [results[r] for r in ids]


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def deterministic_engine(request):
    from engine import EngineConfig, LLMEngine

    torch.set_num_threads(2)
    # A small token budget, so prompts prefill in chunks and those chunks share steps with decodes.
    engine = LLMEngine(EngineConfig(dtype=request.param, device="cpu", kv_cache_memory_gb=0.3, drafter="default",
                                    max_num_batched_tokens=96))
    assert engine.model.deterministic  # on by default where the CPU kernels run
    return engine


def test_greedy_answers_are_the_same_bits_alone_in_a_batch_of_64_joining_and_speculating(deterministic_engine):
    """Tokens and their logprobs (exact floats) of 8 prompts alone, inside a batch of 64 mixed prompts, with half of
    the batch joining mid-flight (its prefill chunks beside the others' decodes), and under speculation."""
    from engine import SamplingParams

    engine = deterministic_engine
    prompts = _chat(engine.tokenizer, 64)

    def params(mode):
        return SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2, speculation=mode)

    alone = [_run(engine, [p], [params("off")])[0] for p in prompts[:8]]
    batch = _run(engine, prompts, [params("off")] * 64)
    assert batch[:8] == alone
    joined = _run(engine, prompts[56:] + prompts[:8], [params("off")] * 16, join_after=3)
    assert joined[8:] == alone
    for mode in ("fixed:3", "adaptive", "adaptive+lookup"):
        verified = engine.speculator.counters.draft_tokens
        spec = _run(engine, prompts[:16], [params(mode)] * 16)
        assert spec[:8] == alone, mode
        assert engine.speculator.counters.draft_tokens > verified or mode != "fixed:3"  # drafts were verified


def test_deterministic_mode_refuses_the_torch_path(monkeypatch):
    """Where the CPU kernels are off (DSPARK_KERNELS=torch, as on a GPU) the step would run library kernels whose
    results depend on the batch: asked for the mode, the engine says so instead of starting; by default it starts
    without it."""
    import engine.ops
    from engine import EngineConfig, LLMEngine

    monkeypatch.setattr(engine.ops, "_kernels", None)
    monkeypatch.setattr(engine.ops, "_loaded", True)
    with pytest.raises(ValueError, match="deterministic=True needs the engine's CPU kernels: they are off"):
        LLMEngine(EngineConfig(dtype="float32", device="cpu", kv_cache_memory_gb=0.1, deterministic=True))
    assert not LLMEngine(EngineConfig(dtype="float32", device="cpu", kv_cache_memory_gb=0.1)).model.deterministic
