"""The fused CPU kernels against plain PyTorch math."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from engine.attention import build_metadata, paged_attention
from engine.ops import Ops, cpu_kernels, lowrank_chunks

pytestmark = pytest.mark.skipif(cpu_kernels() is None, reason="CPU kernels could not be built")

DTYPES = [torch.float64, torch.float32, torch.bfloat16]
PAIRED = cpu_kernels() is not None and cpu_kernels().paired_keys()  # bf16 keys dim-paired for vdpbf16ps
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 2e-2}


def close(a, b, dtype):
    torch.testing.assert_close(a.double(), b.double(), rtol=TOL[dtype], atol=TOL[dtype])


def ref_rms(x, w, eps):
    xf = x.double()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype).double() * w.double()


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_and_add(dtype):
    ops = Ops(torch.device("cpu"))
    x, r, w = torch.randn(37, 96, dtype=dtype), torch.randn(37, 96, dtype=dtype), torch.randn(96, dtype=dtype)
    close(ops.rms_norm(x, w, 1e-5), ref_rms(x, w, 1e-5), dtype)
    want_res = (r.double() + x.double()).to(dtype)
    out = ops.add_rms_norm(x, r, w, 1e-6)
    close(r, want_res, dtype)
    close(out, ref_rms(want_res, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_matches_torch(dtype):
    torch.manual_seed(0)
    gate_up = torch.randn(23, 2 * 80, dtype=dtype) * 6  # large negative and positive gates too
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])
    gate, up = gate_up.chunk(2, dim=-1)
    want = F.silu(gate) * up
    got = Ops(torch.device("cpu")).silu_mul(gate_up)
    assert got.shape == want.shape and got.dtype == dtype
    close(got, want, dtype)
    if dtype == torch.bfloat16:  # the same roundings as eager: at most a last-bit difference, rarely
        assert (got != want).float().mean() < 0.02


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_and_cache_matches_torch_path(dtype, qk_norm):
    torch.manual_seed(0)
    T, H, Hkv, D, bs, nblocks = 11, 6, 2, 32, 16, 8
    qkv = torch.randn(T, (H + 2 * Hkv) * D, dtype=dtype)
    angles = torch.rand(T, D) * 6.3
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    slots = torch.tensor(random.Random(0).sample(range(nblocks * bs), T))
    qn, kn = (torch.randn(D, dtype=dtype), torch.randn(D, dtype=dtype)) if qk_norm else (None, None)
    fused, plain = Ops(torch.device("cpu")), Ops(torch.device("cpu"), kernels=False)
    kc_t, vc = torch.zeros(nblocks, Hkv, D, bs, dtype=dtype), torch.zeros(nblocks, bs, Hkv, D, dtype=dtype)
    kc_ref, vc_ref = torch.zeros(nblocks, bs, Hkv, D, dtype=dtype), torch.zeros(nblocks, bs, Hkv, D, dtype=dtype)
    q = fused.rope_and_cache(qkv, cos, sin, slots, kc_t, vc, H, Hkv, qn, kn, 1e-6)
    q_ref = plain.rope_and_cache(qkv, cos, sin, slots, kc_ref, vc_ref, H, Hkv, qn, kn, 1e-6)
    close(q, q_ref, dtype)
    close(kc_t.permute(0, 3, 1, 2), kc_ref, dtype)  # the kernel keeps keys transposed within a block
    assert torch.equal(vc, vc_ref)
    if dtype == torch.bfloat16 and PAIRED:  # pairs of head dims side by side: [blocks, Hkv, D / 2, bs, 2]
        kc_p = torch.zeros(nblocks, Hkv, D // 2, bs, 2, dtype=dtype)
        fused.rope_and_cache(qkv, cos, sin, slots, kc_p, torch.zeros_like(vc), H, Hkv, qn, kn, 1e-6)
        assert torch.equal(kc_p.permute(0, 3, 1, 2, 4).reshape(nblocks, bs, Hkv, D), kc_t.permute(0, 3, 1, 2))


def reference_attention(q, keys, values, q_lens, ctx_lens, scale):
    """Plain softmax attention per sequence with an explicit causal offset; keys/values: per sequence [L, Hkv, D]."""
    outs, row = [], 0
    for n, L, k, v in zip(q_lens, ctx_lens, keys, values):
        qs = q[row: row + n].double()  # [n, H, D]
        G = qs.shape[1] // k.shape[1]
        kk = k.double().repeat_interleave(G, dim=1)  # [L, H, D]
        vv = v.double().repeat_interleave(G, dim=1)
        s = torch.einsum("nhd,lhd->hnl", qs, kk) * scale
        mask = torch.arange(L)[None, :] <= (L - n + torch.arange(n))[:, None]
        p = s.masked_fill(~mask, float("-inf")).softmax(-1)
        outs.append(torch.einsum("hnl,lhd->nhd", p, vv).reshape(n, -1))
        row += n
    return torch.cat(outs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["transposed", "paired", "plain"])  # plain: the SDPA path
def test_paged_attention_mixed_batch(dtype, layout):
    """Decodes, verify segments and prefill chunks (fresh and continued) in one batch, scattered blocks."""
    if layout == "paired" and not (dtype == torch.bfloat16 and PAIRED):
        pytest.skip("paired keys are bf16 on a CPU with AVX512-BF16")
    fused = layout != "plain"
    torch.manual_seed(1)
    rng = random.Random(1)
    H, Hkv, D, bs, nblocks = 6, 2, 32, 16, 64
    specs = [(1, 40), (1, 1), (5, 70), (8, 8), (16, 33), (30, 30), (24, 100)]  # (q_len, ctx_len incl. new tokens)
    free = list(range(nblocks))
    rng.shuffle(free)
    tables, keys, values = [], [], []
    kc = {"transposed": torch.zeros(nblocks, Hkv, D, bs, dtype=dtype),
          "paired": torch.zeros(nblocks, Hkv, D // 2, bs, 2, dtype=dtype),
          "plain": torch.zeros(nblocks, bs, Hkv, D, dtype=dtype)}[layout]
    vc = torch.zeros(nblocks, bs, Hkv, D, dtype=dtype)
    for q_len, L in specs:
        table = [free.pop() for _ in range(-(-L // bs))]
        k, v = torch.randn(L, Hkv, D, dtype=dtype), torch.randn(L, Hkv, D, dtype=dtype)
        for pos in range(L):
            blk, off = table[pos // bs], pos % bs
            vc[blk, off] = v[pos]
            if layout == "paired":
                kc[blk, :, :, off] = k[pos].view(Hkv, D // 2, 2)
            elif layout == "transposed":
                kc[blk, :, :, off] = k[pos]
            else:
                kc[blk, off] = k[pos]
        tables.append(table)
        keys.append(k)
        values.append(v)
    meta = build_metadata([(n, L - n, t) for (n, L), t in zip(specs, tables)], bs, H // Hkv, torch.device("cpu"),
                          backend="kernel" if fused else "sdpa")
    T = sum(n for n, _ in specs)
    q = torch.randn(T, H, D, dtype=dtype)
    out = paged_attention(q, kc, vc, meta, 0.3, cpu_kernels())
    want = reference_attention(q, keys, values, [n for n, _ in specs], [L for _, L in specs], 0.3)
    close(out, want, dtype)


@pytest.mark.skipif(cpu_kernels() is None or not cpu_kernels().has_linear_small(), reason="needs AVX2 or AVX-512")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_small_against_float64(dtype, with_bias):
    """The few-row linear kernel, 1 to 8 rows and past them (its cache-blocked path, with a tail of 1-3 rows), an
    output count that leaves a tail after the kernel's groups of rows (101), and two widths; then Linear, which routes
    up to SMALL_ROWS rows to it and more rows to oneDNN or F.linear, gives the same answer either way."""
    from engine.model import Linear

    gen = torch.Generator().manual_seed(0)
    for K in (64, 1536):
        w = (torch.randn(101, K, generator=gen) / K ** 0.5).to(dtype)
        b = torch.randn(101, generator=gen).to(dtype) if with_bias else None
        lin = Linear(w, b)
        assert lin._small is not None  # bf16 too, also where oneDNN packs bf16 natively
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        for m in (*range(1, 9), 9, 14, 70):
            x = torch.randn(m, K, generator=gen).to(dtype)
            want = x.double() @ w.double().T + (b.double() if with_bias else 0)
            torch.testing.assert_close(cpu_kernels().linear_small(x, w, b).double(), want, rtol=tol, atol=tol)
            if m <= 8:
                torch.testing.assert_close(lin(x).double(), want, rtol=tol, atol=tol)
        for m in (16, 64):  # past the kernel: linear_bf16 or oneDNN (fp32 over the widened weight without AVX512-BF16)
            x = torch.randn(m, K, generator=gen).to(dtype)
            want = x.double() @ w.double().T + (b.double() if with_bias else 0)
            y = lin(x)
            assert y.dtype == dtype
            torch.testing.assert_close(y.double(), want, rtol=tol, atol=tol)
    with pytest.raises(RuntimeError, match="at least one row"):
        cpu_kernels().linear_small(torch.zeros(0, 64, dtype=dtype), w[:, :64].contiguous(), None)


@pytest.mark.skipif(cpu_kernels() is None or not cpu_kernels().has_linear_bf16(), reason="needs AVX512-BF16")
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_bf16_against_float64(with_bias):
    """The vdpbf16ps kernel at 1 to 24 rows (its blocks of 8 rows and every remainder), an output count that leaves a
    tail after its groups of 3 weight rows (101), and three widths, against float64 over the same bf16 values; Linear
    routes bf16 rows from SMALL_BF16_ROWS + 1 to BF16_ROWS to it (the same bits), fewer to linear_small and more to
    oneDNN, and the answer is the same."""
    from engine.model import Linear

    gen = torch.Generator().manual_seed(3)
    for K in (64, 576, 1536):
        w = (torch.randn(101, K, generator=gen) / K ** 0.5).bfloat16()
        b = torch.randn(101, generator=gen).bfloat16() if with_bias else None
        lin = Linear(w, b)
        assert lin._bf16 is not None
        for m in range(1, Linear.BF16_ROWS + 3):
            x = torch.randn(m, K, generator=gen).bfloat16()
            want = x.double() @ w.double().T + (b.double() if with_bias else 0)
            y = cpu_kernels().linear_bf16(x, w, b)
            assert y.dtype == torch.bfloat16 and y.shape == (m, 101)
            # one rounding to bf16 (2^-9 relative) after an fp32 sum
            torch.testing.assert_close(y.double(), want, rtol=2 ** -8, atol=1e-4)
            if Linear.SMALL_BF16_ROWS < m <= Linear.BF16_ROWS:
                assert torch.equal(lin(x), y)
            else:
                torch.testing.assert_close(lin(x).double(), want, rtol=2e-2, atol=2e-2)
    with pytest.raises(RuntimeError, match="K a multiple of 32"):
        cpu_kernels().linear_bf16(torch.zeros(2, 48, dtype=torch.bfloat16), torch.zeros(4, 48, dtype=torch.bfloat16),
                                  None)
    with pytest.raises(RuntimeError, match="must be bfloat16"):
        cpu_kernels().linear_bf16(torch.zeros(2, 64), torch.zeros(4, 64), None)


def assert_same_bits_as_over_fp32(lin, weight, bias, gen):
    """lin, at 1 to 8 rows, gives linear_small's bits over the fp32 weight, and float64's answer."""
    for m in range(1, 9):
        x = torch.randn(m, weight.shape[1], generator=gen)
        y = lin(x)
        assert torch.equal(y, cpu_kernels().linear_small(x, weight, bias))
        torch.testing.assert_close(y.double(), x.double() @ weight.double().T + bias.double(), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(cpu_kernels() is None or not cpu_kernels().has_linear_small(), reason="needs AVX2 or AVX-512")
def test_linear_keeps_bf16_exact_fp32_weights_in_bf16_with_the_same_result():
    """An fp32 weight that bf16 holds exactly runs the kernel from a bf16 copy (half the bytes) up to 8 rows: the same
    bits as from the fp32 weight, and float64's answer. A weight bf16 cannot hold keeps fp32."""
    from engine.model import Linear

    gen = torch.Generator().manual_seed(1)
    exact = (torch.randn(203, 576, generator=gen) / 24).to(torch.bfloat16).float()
    inexact = exact + 1e-4 * torch.randn(203, 576, generator=gen)
    b = torch.randn(203, generator=gen)
    held, plain = Linear(exact, b), Linear(inexact, b)
    assert held._small_weight.dtype == torch.bfloat16 and plain._small_weight.dtype == torch.float32
    assert_same_bits_as_over_fp32(held, exact, b, gen)
    with pytest.raises(RuntimeError, match="x float32 or bfloat16, w the same or bfloat16"):
        cpu_kernels().linear_small(torch.zeros(2, 576, dtype=torch.bfloat16), exact, None)


@pytest.mark.skipif(cpu_kernels() is None or not cpu_kernels().has_linear_small(), reason="needs AVX2 or AVX-512")
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_linear_kernels_over_bf16_tiles_give_the_same_bits(x_dtype):
    """A bf16 weight whose shape allows it is kept as tiles [N / 8, K / 32, 8, 32] (each group of 8 rows one
    contiguous run): linear_small at 1 to 8 rows and linear_bf16 from 1 row to past Linear's limit (its blocks of 3
    rows and every remainder, with and without a bias) give the same bits over the tiles as over the plain weight,
    and so does Linear, for a bf16 weight and for an fp32 one that bf16 holds exactly. Other shapes stay plain."""
    from engine.model import Linear, tile_bf16

    k = cpu_kernels()
    gen = torch.Generator().manual_seed(4)
    for N, K, with_bias in ((96, 64, False), (200, 1536, True)):
        w = (torch.randn(N, K, generator=gen) / K ** 0.5).bfloat16()
        b = torch.randn(N, generator=gen).to(x_dtype) if with_bias else None
        tiles = tile_bf16(w)
        assert tiles.shape == (N // 8, K // 32, 8, 32) and torch.equal(tiles[1, 1, 2], w[10, 32:64])
        lin = Linear(w if x_dtype == torch.bfloat16 else w.float(), b)
        assert lin._small_weight.shape == tiles.shape and lin.weight is None  # no plain copy beside the tiles
        for m in range(1, Linear.BF16_ROWS + 3):
            x = torch.randn(m, K, generator=gen).to(x_dtype)
            if m <= 8:
                want = k.linear_small(x, w, b)
                assert torch.equal(k.linear_small(x, tiles, b), want)
                if x_dtype == torch.float32 or m <= Linear.SMALL_BF16_ROWS:
                    assert torch.equal(lin(x), want)
            if x_dtype == torch.bfloat16 and k.has_linear_bf16():
                want = k.linear_bf16(x, w, b)
                assert torch.equal(k.linear_bf16(x, tiles, b), want)
                if Linear.SMALL_BF16_ROWS < m <= Linear.BF16_ROWS:
                    assert torch.equal(lin(x), want)
    assert tile_bf16(w[:100]).dim() == 2 and tile_bf16(w[:, :48]).dim() == 2
    with pytest.raises(RuntimeError, match="bf16 tiles"):
        k.linear_small(torch.zeros(1, K, dtype=x_dtype), tiles.float(), None)


@pytest.mark.skipif(cpu_kernels() is None or not cpu_kernels().has_linear_small(), reason="needs AVX2 or AVX-512")
def test_linear_runs_q8_0_valued_weights_from_int8_with_the_same_result():
    """A weight holding GGUF Q8_0 values (gguf-py's own quantizer and dequantizer make them, zero blocks included) is
    found exact and runs the kernel from its int8s and scales up to 8 rows: the same bits as linear_small over the
    fp32 weight, and float64's answer. Values one step off Q8_0 are not taken for it."""
    from gguf import GGMLQuantizationType, quants

    from engine.model import Linear, q8_exact

    gen = torch.Generator().manual_seed(2)
    raw = torch.randn(203, 576, generator=gen) / 24
    raw[7, 64:96] = 0  # an all-zero block: scale 0
    raw[9, :32] = -raw[9, :32].abs()  # a block whose largest magnitude is negative
    exact = torch.from_numpy(quants.dequantize(quants.quantize(raw.numpy(), GGMLQuantizationType.Q8_0),
                                               GGMLQuantizationType.Q8_0))
    q, d = q8_exact(exact)
    assert q.dtype == torch.int8 and torch.equal(q.float() * d.repeat_interleave(32, dim=1), exact)
    off = exact.clone()
    off[100, 5] = torch.nextafter(off[100, 5], torch.tensor(1.0))
    assert q8_exact(off) is None and q8_exact(raw) is None
    b = torch.randn(203, generator=gen)
    lin = Linear(exact, b)
    assert lin._q8 is not None
    assert_same_bits_as_over_fp32(lin, exact, b, gen)
    with pytest.raises(RuntimeError, match="K a multiple of 32"):
        cpu_kernels().linear_small_q8(torch.zeros(1, 48), q[:, :48].contiguous(), d[:, :2].contiguous(), None)


@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_rows_equals_torch(dtype):
    x = torch.randn(9, 5000, dtype=dtype)
    x[3, 17] = x[3, 4000] = x[3].max() + 1  # ties resolve to the first index, as torch does
    assert torch.equal(Ops(torch.device("cpu")).argmax(x), x.argmax(dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_vocab", [False, True])
@pytest.mark.parametrize("anchors", [[3, 77, 650], [3, 77, 650, 9, 999, 0]])  # one group of rows; a full one and 2
def test_markov_greedy_equals_the_step_by_step_loop(dtype, with_vocab, anchors):
    """One kernel call for the drafter's greedy Markov loop gives the same tokens, the same conditioning ids and the
    same updated logits as the loop of add_lowrank_ + argmax_rows it replaces (and as a float64 reference)."""
    k = cpu_kernels()
    G, B, V, R, vocab = 5, len(anchors), 700, 8, 1000
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(G, B, V, generator=gen)
    w1 = (torch.randn(vocab, R, generator=gen) * 0.5).to(dtype)
    w2t = (torch.randn(R, V, generator=gen) * 0.5).to(dtype)
    draft_vocab = torch.randperm(vocab, generator=gen)[:V] if with_vocab else torch.empty(0, dtype=torch.long)
    anchors = torch.tensor(anchors)
    w2c = lowrank_chunks(w2t)  # 700 = 10 chunks of 64 and a padded tail of 60
    loop_u, prev, toks, prevs = u.clone(), anchors.clone(), [], []
    for j in range(G):
        k.add_lowrank_(loop_u[j], w1[prev].contiguous(), w2c)
        nxt = k.argmax_rows(loop_u[j])
        toks.append(nxt)
        prevs.append(prev)
        ref = (u[j].double() + w1[prev].double() @ w2t.double()).argmax(-1)
        assert torch.equal(nxt, ref)
        prev = draft_vocab[nxt] if with_vocab else nxt
    fused_u = u.clone()
    local, prev_all = k.markov_greedy(fused_u, w1, w2c, anchors, draft_vocab)
    assert torch.equal(local, torch.stack(toks, 1)) and torch.equal(prev_all, torch.stack(prevs, 1))
    assert torch.equal(fused_u, loop_u)


def test_kernels_release_the_gil_while_they_run():
    """A server's event loop keeps running Python beside a kernel call: here another thread sees a call half done.
    add_rms_norm adds x (ones) into the residual row by row, in order on one thread, so the first row is ahead of the
    last only while a call runs. The watcher reads the first row, then the last, each read holding the GIL. A kernel
    that held the GIL would run whole before or after each read, so the first row could never be seen ahead of the
    later-read last one. (Every kernel is bound with the same GIL release.)"""
    import threading

    k = cpu_kernels()
    x = torch.ones(2048, 4096)
    residual, w = torch.zeros_like(x), torch.ones(4096)
    rows = residual.numpy()  # the watcher reads through numpy: plain reads under the GIL
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # rows in order, on this thread; the watcher is free to run on another core
    stop, seen = threading.Event(), threading.Event()

    def watch():
        while not stop.is_set():
            first = rows[0, 0]
            if first > rows[-1, -1]:
                seen.set()
                return

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for calls in range(1, 501):  # the first call is enough unless the machine is very busy
            k.add_rms_norm(x, residual, w, 1e-6)
            if seen.is_set():
                break
    finally:
        stop.set()
        watcher.join()
        torch.set_num_threads(threads)
    assert seen.is_set(), f"no read saw a call in progress in {calls} calls: the kernel holds the GIL"
    assert residual[0, 0] == residual[-1, -1] == calls  # and every call added x to every row


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_decoder_layers_in_one_call_give_the_python_loops_bits(family, dtype, tmp_path, default_tokenizer):
    """DecoderLM.forward runs its layer loop as one C++ call (decoder_layers) for steps without prefill chunks; it must
    give the Python loop's logits, taps and K/V to the bit: decodes and verify segments of mixed lengths, qkv bias
    (qwen2) and q/k norms (qwen3), at row counts on each path of Linear (linear_small, linear_bf16, oneDNN)."""
    from engine import LLMEngine, SamplingParams
    from engine.config import EngineConfig
    from engine.scheduler import ScheduledSeq
    from tests.helpers import make_tiny_model

    folder = make_tiny_model(family, tmp_path / family, default_tokenizer, vocab_size=300)
    engine = LLMEngine(EngineConfig(model=str(folder), dtype=str(dtype).removeprefix("torch."), device="cpu",
                                    tap_layers=[1, 3]))
    model, rng = engine.model, random.Random(0)
    for i in range(12):
        engine.add_request(str(i), [rng.randrange(3, 300) for _ in range(rng.randrange(3, 40))],
                           SamplingParams(max_tokens=64, ignore_eos=True))
    while any(s.num_output_tokens == 0 for s in engine.requests.values()):
        engine.step()
    seqs = list(engine.requests.values())
    for num_seqs, drafts in ((1, [0]), (2, [0, 0]), (3, [2, 0, 4]), (4, [7, 1, 0, 3]), (12, [1] * 12), (12, [7] * 12)):
        batch = [ScheduledSeq(seq, 1, [rng.randrange(3, 300) for _ in range(k)])
                 for seq, k in zip(seqs[:num_seqs], drafts)]
        for s in batch:
            assert engine.block_manager.allocate(s.seq, s.seq.num_computed_tokens + 1 + len(s.draft_tokens))
        rows = sum(s.num_query_tokens for s in batch)
        model._layer_args[rows] = None
        python = engine.runner.execute(batch)
        kv = [(k.clone(), v.clone()) for k, v in zip(engine.kv_cache.k, engine.kv_cache.v)]
        del model._layer_args[rows]
        one_call = engine.runner.execute(batch)  # writes the same slots: any other K/V would show below
        assert model._layer_args[rows] is not None, f"{rows} rows did not take the one-call loop"
        assert torch.equal(one_call.logits, python.logits)
        for i in python.taps:
            assert torch.equal(one_call.taps[i], python.taps[i])
        for (k1, v1), k2, v2 in zip(kv, engine.kv_cache.k, engine.kv_cache.v):
            assert torch.equal(k1, k2) and torch.equal(v1, v2)
