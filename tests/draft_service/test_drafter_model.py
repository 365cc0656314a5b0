"""DSpark drafter model (draft_service): behaviour against a plain reference implementation.

The reference below is written from the DeepSpec/DSpark definition, straight from a dict of
tensors named as in DeepSpec checkpoints: per sequence, full attention over
concat(context, block) with an explicit mask, no pooling, no batching, no paging.
"""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from draft_service import ContextPoolFull, DraftContextPool, DraftRequest, DSparkConfig, DSparkDrafter
from engine.penalties import DraftPenalties

pytestmark = pytest.mark.usefixtures("kernels")  # each test on the CPU kernels and on the torch ops

F64 = torch.float64


def make_cfg(**kw):
    base = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                rope_theta=10000.0, max_position_embeddings=512, block_size=4,
                target_layer_ids=[0, 3, 5], num_target_layers=8, mask_token_id=60,
                markov_rank=6, markov_head_type="vanilla",
                enable_confidence_head=True, confidence_head_with_markov=True)
    base.update(kw)
    return DSparkConfig(**base)


def make_model(cfg, seed=0, dtype=F64, draft_vocab=None):
    torch.manual_seed(seed)
    m = DSparkDrafter(cfg, draft_vocab=draft_vocab).init_weights()
    with torch.no_grad():  # non-trivial norms/biases so every weight matters
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
        # larger weights than N(0, 0.02) so drafts are not all the same token
        for name, p in m.named_parameters():
            if "proj" in name or "markov" in name or name in ("fc.weight", "lm_head.weight"):
                p.mul_(10.0)
    return m.to(dtype).eval()


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_draft(a, b):
    """Two proposals agree: the same tokens, and probabilities and confidences equal to fp64 rounding. (Not bitwise:
    MKL's dgemm rounds differently for other row counts and, on some CPUs, other memory alignments.)"""
    assert torch.equal(a.tokens, b.tokens)
    torch.testing.assert_close(a.probs, b.probs, rtol=0, atol=1e-12)
    if a.confidence is not None or b.confidence is not None:
        torch.testing.assert_close(a.confidence, b.confidence, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- reference
def ref_rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def ref_rope(x, pos, theta):
    """x [n, heads, hd] at positions [n]; HF default rope (angles computed in fp32 like HF)."""
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = pos.to(torch.float32)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], -1)
    cos, sin = ang.cos().to(x.dtype)[:, None, :], ang.sin().to(x.dtype)[:, None, :]
    rotated = torch.cat([-x[..., hd // 2:], x[..., : hd // 2]], -1)
    return x * cos + rotated * sin


def ref_draft(W, cfg, taps, ctx_pos, anchor, anchor_pos, temperature=0.0, forced=None, draft_vocab=None,
              block_tokens=None, penalties=None):
    """Returns tokens [G], p_d [G, V], confidence [G]. `forced` teacher-forces the chosen tokens; `block_tokens` [G]
    are the block's input tokens (default: the anchor, then mask tokens); `penalties` (DraftPenalties) penalise the
    base logits of every position, as `ref_penalised` says."""
    eps, H, Hkv, hd, G = cfg.rms_norm_eps, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.block_size

    def lin(x, name):
        y = x @ W[name + ".weight"].T
        return y + W[name + ".bias"] if name + ".bias" in W else y

    ctx = ref_rms(taps @ W["fc.weight"].T, W["hidden_norm.weight"], eps)
    T = ctx.shape[0]
    x = W["embed_tokens.weight"][torch.tensor(block_tokens or [anchor] + [cfg.mask_token_id] * (G - 1))]
    bpos = anchor_pos + torch.arange(G)
    # Block queries see every context token and every block token (non-causal block).
    allowed = torch.ones(G, T + G, dtype=torch.bool)
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        hn = ref_rms(x, W[p + "input_layernorm.weight"], eps)
        q = ref_rope(ref_rms(lin(hn, p + "self_attn.q_proj").view(G, H, hd), W[p + "self_attn.q_norm.weight"], eps), bpos, cfg.rope_theta)

        def keys(src, pos):
            k = ref_rms(lin(src, p + "self_attn.k_proj").view(-1, Hkv, hd), W[p + "self_attn.k_norm.weight"], eps)
            return ref_rope(k, pos, cfg.rope_theta), lin(src, p + "self_attn.v_proj").view(-1, Hkv, hd)

        kc, vc = keys(ctx, ctx_pos)  # context injected raw into every layer's k/v proj
        kb, vb = keys(hn, bpos)
        K = torch.cat([kc, kb]).repeat_interleave(H // Hkv, dim=1)
        V = torch.cat([vc, vb]).repeat_interleave(H // Hkv, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, K) / math.sqrt(hd)
        a = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1)
        x = x + lin(torch.einsum("hqk,khd->qhd", a, V).reshape(G, H * hd), p + "self_attn.o_proj")
        hn = ref_rms(x, W[p + "post_attention_layernorm.weight"], eps)
        x = x + lin(F.silu(lin(hn, p + "mlp.gate_proj")) * lin(hn, p + "mlp.up_proj"), p + "mlp.down_proj")
    h = ref_rms(x, W["norm.weight"], eps)
    U = h @ W["lm_head.weight"].T
    if penalties is not None:
        full = torch.full((G, cfg.vocab_size), float("-inf"), dtype=U.dtype)
        cols = torch.arange(U.shape[1]) if draft_vocab is None else draft_vocab
        full[:, cols] = U
        U = torch.stack([ref_penalised(row, penalties) for row in full])[:, cols]
    r = cfg.markov_rank
    toks, probs, confs, prev, state = [], [], [], anchor, torch.zeros(r, dtype=h.dtype)
    for k in range(G):
        logits = U[k].clone()
        e = W["markov_head.markov_w1.weight"][prev] if r else None
        if r:
            if cfg.markov_head_type == "vanilla":
                z = e
            elif cfg.markov_head_type == "gated":
                z = torch.sigmoid(lin(torch.cat([h[k], e]), "markov_head.gate_proj")) * e
            else:  # rnn
                g, c, o = lin(torch.cat([state, e, h[k]]), "markov_head.joint_proj").chunk(3)
                state = torch.sigmoid(g) * state + (1 - torch.sigmoid(g)) * torch.tanh(c)
                z = torch.tanh(o)
            logits = logits + z @ W["markov_head.markov_w2.weight"].T
        p_k = torch.softmax(logits / temperature if temperature > 0 else logits, -1)
        j = int(logits.argmax()) if forced is None else int(forced[k])
        if draft_vocab is not None:
            full = torch.zeros(cfg.vocab_size, dtype=p_k.dtype)
            full[draft_vocab] = p_k
            p_k = full
            if forced is None:
                j = int(draft_vocab[j])
        if cfg.enable_confidence_head:
            f = torch.cat([h[k], e]) if cfg.confidence_head_with_markov else h[k]
            confs.append(torch.sigmoid(lin(f, "confidence_head.proj"))[0])
        toks.append(j)
        probs.append(p_k)
        prev = j
    conf = torch.stack(confs) if confs else None
    return torch.tensor(toks), torch.stack(probs), conf


def ref_penalised(logits, p):
    """The penalties token by token, as the OpenAI API and vLLM define them: logit bias, then the repetition penalty
    on every prompt and output token, then the frequency and presence penalties on the output's."""
    out = logits.clone()
    for token, bias in (p.logit_bias or {}).items():
        out[token] += bias
    r = p.repetition_penalty
    for token in set(p.prompt) | set(p.output):
        out[token] = out[token] / r if out[token] > 0 else out[token] * r
    for token in set(p.output):
        out[token] -= p.frequency_penalty * p.output.count(token) + p.presence_penalty
    return out


def rand_taps(cfg, n, seed, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, cfg.num_taps * cfg.hidden_size, generator=g, dtype=dtype)


# --------------------------------------------------------------------------- tests
HEADS = [dict(markov_head_type="vanilla"),
         dict(markov_head_type="gated"),
         dict(markov_head_type="rnn", confidence_head_with_markov=False),
         dict(markov_rank=0, markov_head_type=None, confidence_head_with_markov=False)]


@pytest.mark.parametrize("head", HEADS, ids=["vanilla", "gated", "rnn", "no-markov"])
def test_batched_propose_matches_reference(head):
    cfg = make_cfg(**head)
    model = make_model(cfg)
    W = weights(model)
    lens = [9, 1, 23, 14]
    taps = [rand_taps(cfg, n, seed=i) for i, n in enumerate(lens)]
    pool = DraftContextPool(model, max_tokens=256)
    hs = [pool.create_context() for _ in lens]
    pool.append_many([(h, t, torch.arange(len(t))) for h, t in zip(hs, taps)])
    anchors = [5, 17, 59, 0]
    out = pool.propose([(h, a, n) for h, a, n in zip(hs, anchors, lens)])
    assert out.tokens.shape == (4, cfg.block_size) and out.probs.shape == (4, cfg.block_size, cfg.vocab_size)
    for b, (t, a, n) in enumerate(zip(taps, anchors, lens)):
        toks, probs, conf = ref_draft(W, cfg, t, torch.arange(n), a, n)
        assert torch.equal(out.tokens[b], toks)
        torch.testing.assert_close(out.probs[b], probs, rtol=0, atol=1e-12)
        torch.testing.assert_close(out.token_probs[b], probs.gather(-1, toks[:, None])[:, 0], rtol=0, atol=1e-12)
        if conf is None:
            assert out.confidence is None
        else:
            torch.testing.assert_close(out.confidence[b], conf, rtol=0, atol=1e-12)
    assert len(set(out.tokens.flatten().tolist())) > 3  # the test model is not degenerate


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
def test_paged_attention_kernel_path_matches_the_torch_path(dtype):
    """With head_dim and page size multiples of 16 the pool attends with the engine's CPU kernel straight from its
    pages (the block written past each context, non-causal); elsewhere, SDPA over gathered pages. Both match the
    reference (float64) and each other, for contexts that end inside, at and across page boundaries."""
    from engine.ops import cpu_kernels

    if cpu_kernels() is None:
        pytest.skip("CPU kernels unavailable")
    cfg = make_cfg(head_dim=16, block_size=5)
    model = make_model(cfg, dtype=dtype)
    lens = [0, 1, 11, 12, 16, 40]  # blocks of 5: ending inside, at, and past a 16-token page
    fused, plain = DraftContextPool(model, max_tokens=512), DraftContextPool(model, max_tokens=512, kernels=False)
    assert fused.ops.fused and not plain.ops.fused
    reqs = {}
    for pool in (fused, plain):
        hs = [pool.create_context() for _ in lens]
        pool.append_many([(h, rand_taps(cfg, n, seed=20 + i, dtype=dtype), torch.arange(n))
                          for i, (h, n) in enumerate(zip(hs, lens))])
        reqs[pool] = pool.propose([(h, (11 * i) % 60, n) for i, (h, n) in enumerate(zip(hs, lens))])
    a, b = reqs[fused], reqs[plain]
    tol = {F64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(a.probs, b.probs, rtol=0, atol=tol)
    torch.testing.assert_close(a.confidence, b.confidence, rtol=0, atol=tol)
    if dtype == F64:
        W = weights(model)
        for i, n in enumerate(lens):
            toks, probs, _ = ref_draft(W, cfg, rand_taps(cfg, n, seed=20 + i), torch.arange(n), (11 * i) % 60, n)
            assert torch.equal(a.tokens[i], toks)
            torch.testing.assert_close(a.probs[i], probs, rtol=0, atol=1e-12)
    assert fused.bytes_in_use == plain.bytes_in_use  # the pages lent to the blocks went back


def test_one_block_per_context_per_call():
    cfg = make_cfg()
    pool = DraftContextPool(make_model(cfg), max_tokens=64)
    h = pool.create_context()
    pool.append(h, rand_taps(cfg, 5, seed=1), torch.arange(5))
    twice = pool.propose([(h, 3, 5), (h, 3, 5)])  # the same block twice: one backbone pass, two rows
    assert torch.equal(twice.tokens[0], twice.tokens[1])
    with pytest.raises(ValueError, match="one block"):
        pool.propose([(h, 3, 5), (h, 4, 5)])


def test_batched_equals_per_sequence():
    cfg = make_cfg()
    model = make_model(cfg)
    lens = [30, 3, 17, 0, 1]  # 0: empty context (block attends only to itself)
    pool = DraftContextPool(model, max_tokens=512)
    hs = []
    for i, n in enumerate(lens):
        hs.append(pool.create_context())
        pool.append(hs[-1], rand_taps(cfg, n, seed=10 + i), torch.arange(n))
    reqs = [DraftRequest(h, anchor_token=(7 * i) % 60, anchor_pos=n) for i, (h, n) in enumerate(zip(hs, lens))]
    batched = pool.propose(reqs)
    for b, r in enumerate(reqs):
        single = pool.propose([r])
        assert torch.equal(batched.tokens[b], single.tokens[0])
        torch.testing.assert_close(batched.probs[b], single.probs[0], rtol=0, atol=1e-13)
        torch.testing.assert_close(batched.confidence[b], single.confidence[0], rtol=0, atol=1e-13)


def test_truncate_equals_fresh_context():
    cfg = make_cfg()
    model = make_model(cfg)
    taps = rand_taps(cfg, 40, seed=3)
    pool = DraftContextPool(model, max_tokens=256)
    h = pool.create_context()
    # built in chunks like a decode loop (prefill, then accepted tokens each round)
    for a, b in [(0, 21), (21, 24), (24, 25), (25, 40)]:
        pool.append(h, taps[a:b], torch.arange(a, b))
    used = pool.bytes_in_use
    pool.truncate(h, 19)  # e.g. roll back rejected tokens
    assert pool.length(h) == 19 and pool.bytes_in_use < used
    fresh = pool.create_context()
    pool.append(fresh, taps[:19], torch.arange(19))
    o = pool.propose([(h, 4, 19), (fresh, 4, 19)])
    assert torch.equal(o.tokens[0], o.tokens[1])
    torch.testing.assert_close(o.probs[0], o.probs[1], rtol=0, atol=1e-12)
    torch.testing.assert_close(o.confidence[0], o.confidence[1], rtol=0, atol=1e-12)
    # appending after truncate keeps working
    pool.append(h, taps[19:30], torch.arange(19, 30))
    toks, probs, _ = ref_draft(weights(model), cfg, taps[:30], torch.arange(30), 4, 30)
    out = pool.propose([(h, 4, 30)])
    assert torch.equal(out.tokens[0], toks)
    torch.testing.assert_close(out.probs[0], probs, rtol=0, atol=1e-12)


def test_release_frees_memory_and_budget_overflow_raises():
    cfg = make_cfg()
    model = make_model(cfg)
    pool = DraftContextPool(model, max_tokens=64, page_size=16)
    token_bytes = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 8
    assert pool.capacity_bytes == 64 * token_bytes and pool.bytes_in_use == 0
    h1, h2 = pool.create_context(), pool.create_context()
    pool.append(h1, rand_taps(cfg, 20, 0), torch.arange(20))
    assert pool.bytes_in_use == 32 * token_bytes and pool.num_live_contexts == 2
    with pytest.raises(ContextPoolFull):
        pool.append(h2, rand_taps(cfg, 45, 1), torch.arange(45))
    assert pool.length(h2) == 0 and pool.bytes_in_use == 32 * token_bytes  # nothing written
    with pytest.raises(ContextPoolFull):  # all-or-nothing across sequences
        pool.append_many([(h2, rand_taps(cfg, 16, 2), torch.arange(16)), (h1, rand_taps(cfg, 30, 3), torch.arange(20, 50))])
    assert pool.length(h1) == 20 and pool.length(h2) == 0
    pool.append(h2, rand_taps(cfg, 32, 1), torch.arange(32))  # exactly fills the budget
    assert pool.free_tokens == 0
    pool.release(h1)
    pool.release(h2)
    assert pool.bytes_in_use == 0 and pool.num_live_contexts == 0
    with pytest.raises(KeyError):
        pool.propose([(h1, 0, 20)])
    h3 = pool.create_context()  # freed pages are reusable
    pool.append(h3, rand_taps(cfg, 64, 4), torch.arange(64))
    assert pool.bytes_in_use == pool.capacity_bytes
    by_bytes = DraftContextPool(model, max_bytes=5 * 16 * token_bytes - 1, page_size=16)
    assert by_bytes.capacity_bytes == 4 * 16 * token_bytes  # a byte budget is never exceeded


def test_greedy_is_argmax_and_sampling_is_reproducible():
    cfg = make_cfg()
    model = make_model(cfg)
    W = weights(model)
    taps = rand_taps(cfg, 12, seed=5)
    pool = DraftContextPool(model, max_tokens=128)
    h = pool.create_context()
    pool.append(h, taps, torch.arange(12))
    greedy = pool.propose([(h, 9, 12)])
    assert torch.equal(greedy.tokens, greedy.probs.argmax(-1))

    def sample(seed, temp=0.8):
        g = torch.Generator().manual_seed(seed)
        return pool.propose([DraftRequest(h, 9, 12, temperature=temp, generator=g)] * 2)

    s1, s2 = sample(123), sample(123)
    assert torch.equal(s1.tokens, s2.tokens) and torch.equal(s1.probs, s2.probs)
    assert not torch.equal(s1.tokens[0], s1.tokens[1])  # one generator, advanced per row
    assert any(not torch.equal(sample(i).tokens, s1.tokens) for i in range(5))
    # p_d of a sampled block is the tempered Markov-corrected distribution given the sampled prefix
    for b in range(2):
        toks, probs, conf = ref_draft(W, cfg, taps, torch.arange(12), 9, 12, temperature=0.8, forced=s1.tokens[b])
        torch.testing.assert_close(s1.probs[b], probs, rtol=0, atol=1e-12)
        torch.testing.assert_close(s1.confidence[b], conf, rtol=0, atol=1e-12)
        assert (s1.token_probs[b] > 0).all()
    # greedy and sampled rows mix in one batch without affecting each other
    mixed = pool.propose([(h, 9, 12), DraftRequest(h, 9, 12, 0.8, torch.Generator().manual_seed(123))])
    assert torch.equal(mixed.tokens[0], greedy.tokens[0]) and torch.equal(mixed.tokens[1], s1.tokens[0])


@pytest.mark.parametrize("draft_vocab", [False, True], ids=["full-vocab", "draft-vocab"])
def test_penalties_shape_the_block_as_they_shape_the_target(draft_vocab):
    """A request's penalties (engine/penalties.py) apply to the drafter's base logits at every block position, the
    block's own drafts not counted: greedy drafts and sampled p_d equal the reference's with the same penalties, a
    penalised request beside an unpenalised one in the same batch leaves that one as it was, and the penalties do
    change the drafts (the drafter's first proposals are the output they penalise)."""
    cfg = make_cfg()
    full = make_model(cfg)
    W, sub = weights(full), None
    if draft_vocab:
        sub = torch.tensor(sorted(torch.randperm(cfg.vocab_size, generator=torch.Generator().manual_seed(1))[:30]
                                  .tolist()))
        cfg = make_cfg(draft_vocab_size=len(sub))
        W["lm_head.weight"] = W["lm_head.weight"][sub]
        W["markov_head.markov_w2.weight"] = W["markov_head.markov_w2.weight"][sub]
        W["draft_vocab"] = sub
    model = DSparkDrafter(cfg, draft_vocab=sub).to(F64).eval()
    model.load_state_dict(W)
    taps = rand_taps(cfg, 12, seed=5)
    pool = DraftContextPool(model, max_tokens=128)
    h = pool.create_context()
    pool.append(h, taps, torch.arange(12))
    plain = pool.propose([(h, 9, 12)])
    seen = plain.tokens[0].tolist()
    kinds = [DraftPenalties(output=seen, prompt=[], frequency_penalty=1.5, presence_penalty=2.0),
             DraftPenalties(output=seen[:2], prompt=[3, 9, 17], repetition_penalty=1.7),
             DraftPenalties(output=[], prompt=[], logit_bias={int(seen[0]): -30.0, int(seen[-1]): 4.0}),
             DraftPenalties(output=seen + seen[:1], prompt=[9], logit_bias={int(seen[1]): 2.0}, repetition_penalty=0.6,
                            frequency_penalty=-0.5, presence_penalty=0.7)]
    changed = 0
    for p in kinds:
        got = pool.propose([DraftRequest(h, 9, 12, penalties=p), (h, 9, 12)])
        toks, probs, conf = ref_draft(W, cfg, taps, torch.arange(12), 9, 12, draft_vocab=sub, penalties=p)
        assert torch.equal(got.tokens[0], toks)
        torch.testing.assert_close(got.probs[0], probs, rtol=0, atol=1e-12)
        torch.testing.assert_close(got.confidence[0], conf, rtol=0, atol=1e-12)
        assert torch.equal(got.tokens[1], plain.tokens[0])
        changed += not torch.equal(toks, plain.tokens[0])
        sampled = pool.propose([DraftRequest(h, 9, 12, 0.8, torch.Generator().manual_seed(4), penalties=p)])
        _, probs, _ = ref_draft(W, cfg, taps, torch.arange(12), 9, 12, temperature=0.8, forced=sampled.tokens[0],
                                draft_vocab=sub, penalties=p)
        torch.testing.assert_close(sampled.probs[0], probs, rtol=0, atol=1e-12)
    assert changed >= 3


def test_sampling_frequencies_follow_p_d():
    cfg = make_cfg(block_size=2)
    model = make_model(cfg)
    pool = DraftContextPool(model, max_tokens=64)
    h = pool.create_context()
    pool.append(h, rand_taps(cfg, 5, seed=8), torch.arange(5))
    n = 4000
    out = pool.propose([DraftRequest(h, 3, 5, 1.5, torch.Generator().manual_seed(0))] * n)
    p0 = out.probs[0, 0]  # first position does not depend on sampled tokens
    freq = torch.bincount(out.tokens[:, 0], minlength=cfg.vocab_size).to(F64) / n
    assert (freq - p0).abs().max() < 4 * math.sqrt(p0.max() / n)


def test_save_load_roundtrip(tmp_path):
    cfg = make_cfg(markov_head_type="gated")
    model = make_model(cfg)
    embed, head = model.embed_tokens.weight.detach().clone(), model.lm_head.weight.detach().clone()
    model.save_pretrained(tmp_path / "slim")  # default: embeddings come from the target
    model.save_pretrained(tmp_path / "full", include_embeddings=True)
    with open(tmp_path / "slim" / "config.json") as f:
        assert json.load(f)["architectures"] == ["Qwen3DSparkModel"]
    slim = DSparkDrafter.from_pretrained(tmp_path / "slim", target_embed=embed, target_lm_head=head, dtype=F64)
    full = DSparkDrafter.from_pretrained(tmp_path / "full", dtype=F64)
    assert slim.embed_tokens.weight.data_ptr() == embed.data_ptr()  # shared with the target, not copied
    with pytest.raises(ValueError):
        DSparkDrafter.from_pretrained(tmp_path / "slim", dtype=F64)
    taps = rand_taps(cfg, 15, 1)
    outs = []
    for m in (model, slim, full):
        pool = DraftContextPool(m, max_tokens=64)
        h = pool.create_context()
        pool.append(h, taps, torch.arange(15))
        outs.append(pool.propose([(h, 2, 15)]))
    for o in outs[1:]:
        assert_same_draft(o, outs[0])
    bf16 = DSparkDrafter.from_pretrained(tmp_path / "full", dtype=torch.bfloat16)
    pool = DraftContextPool(bf16, max_tokens=64)
    h = pool.create_context()
    pool.append(h, taps, torch.arange(15))
    o = pool.propose([(h, 2, 15, 1.0)])
    assert o.probs.dtype == torch.float32 and torch.allclose(o.probs.sum(-1), torch.ones(1, cfg.block_size))


def deepspec_config_json(cfg, path, hf_version="5"):
    """config.json as DeepSpec writes it: the target's Qwen3Config deep-copied + DSpark fields, HF save_pretrained."""
    d = {"architectures": ["Qwen3DSparkModel"], "attention_bias": False, "attention_dropout": 0.0,
         "block_size": cfg.block_size, "bos_token_id": 1, "confidence_head_with_markov": True,
         "enable_confidence_head": True, "eos_token_id": 2, "head_dim": cfg.head_dim, "hidden_act": "silu",
         "hidden_size": cfg.hidden_size, "initializer_range": 0.02, "intermediate_size": cfg.intermediate_size,
         "layer_types": ["full_attention"] * cfg.num_hidden_layers, "markov_head_type": "vanilla",
         "markov_rank": cfg.markov_rank, "mask_token_id": cfg.mask_token_id,
         "max_position_embeddings": cfg.max_position_embeddings, "max_window_layers": 28, "model_type": "qwen3",
         "num_anchors": 512, "num_attention_heads": cfg.num_attention_heads,
         "num_hidden_layers": cfg.num_hidden_layers, "num_key_value_heads": cfg.num_key_value_heads,
         "num_target_layers": 8, "pad_token_id": None, "rms_norm_eps": cfg.rms_norm_eps,
         "sliding_window": None, "target_layer_ids": cfg.target_layer_ids, "tie_word_embeddings": False,
         "use_cache": True, "use_sliding_window": False, "vocab_size": cfg.vocab_size}
    if hf_version == "5":
        d.update(dtype="bfloat16", transformers_version="5.10.2",
                 rope_parameters={"rope_theta": cfg.rope_theta, "rope_type": "default"})
    else:
        d.update(torch_dtype="bfloat16", transformers_version="4.57.0", rope_theta=cfg.rope_theta, rope_scaling=None)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(d, indent=2))


@pytest.mark.parametrize("with_embeddings,hf_version", [(True, "5"), (False, "5"), (False, "4")])
def test_loads_checkpoint_in_deepspec_layout(tmp_path, with_embeddings, hf_version):
    cfg = make_cfg()
    d, r, V, kvd = cfg.hidden_size, cfg.markov_rank, cfg.vocab_size, cfg.num_key_value_heads * cfg.head_dim
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, s=0.3):
        return (s * torch.randn(*shape, generator=g)).to(torch.bfloat16)  # DeepSpec saves bf16

    W = {"fc.weight": rnd(d, cfg.num_taps * d), "hidden_norm.weight": 1 + rnd(d, s=0.1),
         "norm.weight": 1 + rnd(d, s=0.1), "markov_head.markov_w1.weight": rnd(V, r),
         "markov_head.markov_w2.weight": rnd(V, r), "confidence_head.proj.weight": rnd(1, d + r),
         "confidence_head.proj.bias": rnd(1)}
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        W.update({p + "input_layernorm.weight": 1 + rnd(d, s=0.1), p + "post_attention_layernorm.weight": 1 + rnd(d, s=0.1),
                  p + "self_attn.q_proj.weight": rnd(cfg.num_attention_heads * cfg.head_dim, d),
                  p + "self_attn.k_proj.weight": rnd(kvd, d), p + "self_attn.v_proj.weight": rnd(kvd, d),
                  p + "self_attn.o_proj.weight": rnd(d, cfg.num_attention_heads * cfg.head_dim),
                  p + "self_attn.q_norm.weight": 1 + rnd(cfg.head_dim, s=0.1),
                  p + "self_attn.k_norm.weight": 1 + rnd(cfg.head_dim, s=0.1),
                  p + "mlp.gate_proj.weight": rnd(cfg.intermediate_size, d), p + "mlp.up_proj.weight": rnd(cfg.intermediate_size, d),
                  p + "mlp.down_proj.weight": rnd(d, cfg.intermediate_size)})
    target_embed, target_head = rnd(V, d, s=1.0), rnd(V, d, s=1.0)
    stored = dict(W)
    if with_embeddings:
        stored.update({"embed_tokens.weight": target_embed, "lm_head.weight": target_head})
    deepspec_config_json(cfg, tmp_path, hf_version)
    save_file(stored, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})

    kw = {} if with_embeddings else dict(target_embed=target_embed, target_lm_head=target_head)
    model = DSparkDrafter.from_pretrained(tmp_path, dtype=F64, **kw)
    assert model.config.block_size == cfg.block_size and model.config.rope_theta == cfg.rope_theta
    assert model.config.target_layer_ids == cfg.target_layer_ids and model.config.num_anchors == 512
    pool = DraftContextPool(model, max_tokens=64)
    h = pool.create_context()
    taps = rand_taps(cfg, 13, 2)
    pool.append(h, taps, torch.arange(13))
    out = pool.propose([(h, 11, 13)])
    Wref = {k: v.to(F64) for k, v in W.items()}
    Wref.update({"embed_tokens.weight": target_embed.to(F64), "lm_head.weight": target_head.to(F64)})
    toks, probs, conf = ref_draft(Wref, cfg, taps, torch.arange(13), 11, 13)
    assert torch.equal(out.tokens[0], toks)
    torch.testing.assert_close(out.probs[0], probs, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.confidence[0], conf, rtol=0, atol=1e-12)
    # re-saving keeps DeepSpec's tensor names and config fields
    model.save_pretrained(tmp_path / "resaved")
    again = json.loads((tmp_path / "resaved" / "config.json").read_text())
    assert again["rope_parameters"]["rope_theta"] == cfg.rope_theta and again["model_type"] == "qwen3"
    for k in ("block_size", "target_layer_ids", "mask_token_id", "markov_rank", "markov_head_type",
              "enable_confidence_head", "confidence_head_with_markov", "num_target_layers", "bos_token_id"):
        assert k in again


def test_hf_written_config_parses(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = make_cfg()
    t = transformers.Qwen3Config(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                                 num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                 rope_theta=5e5, max_position_embeddings=512)
    # DeepSpec build_draft_config: copy the target config, then set the DSpark fields.
    t.architectures = ["Qwen3DSparkModel"]
    t.num_target_layers, t.num_hidden_layers, t.block_size = 8, 2, 4
    t.tie_word_embeddings, t.layer_types = False, ["full_attention"] * 2
    t.mask_token_id, t.target_layer_ids, t.num_anchors = 60, [0, 3, 5], 512
    t.enable_confidence_head, t.confidence_head_with_markov = True, True
    t.markov_rank, t.markov_head_type = 6, "vanilla"
    t.save_pretrained(tmp_path)
    c = DSparkConfig.from_json(str(tmp_path))
    assert (c.rope_theta, c.block_size, c.num_hidden_layers, c.markov_rank, c.head_dim) == (5e5, 4, 2, 6, 8)
    DSparkDrafter(c)  # shapes consistent


def test_rope_matches_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    cfg = make_cfg(rope_theta=1e6, head_dim=16, max_position_embeddings=4096)
    hf = Qwen3RotaryEmbedding(transformers.Qwen3Config(hidden_size=64, num_attention_heads=4, head_dim=16,
                                                       rope_theta=1e6, max_position_embeddings=4096))
    pos = torch.tensor([0, 1, 7, 100, 4095])
    cos, sin = hf(torch.zeros(1, dtype=torch.float32), pos[None])
    ours_cos, ours_sin = DSparkDrafter(cfg).rope(pos)
    assert torch.equal(cos[0, :, :8], ours_cos) and torch.equal(sin[0, :, :8], ours_sin)


def test_draft_vocab_hook(tmp_path):
    cfg = make_cfg()
    full = make_model(cfg)
    sub = torch.tensor(sorted(torch.randperm(cfg.vocab_size, generator=torch.Generator().manual_seed(1))[:25].tolist()))
    cfg_d = make_cfg(draft_vocab_size=len(sub))
    model = DSparkDrafter(cfg_d, draft_vocab=sub).to(F64).eval()
    W = weights(full)
    W["lm_head.weight"] = W["lm_head.weight"][sub]
    W["markov_head.markov_w2.weight"] = W["markov_head.markov_w2.weight"][sub]
    W["draft_vocab"] = sub
    model.load_state_dict(W)
    taps = rand_taps(cfg, 10, 3)
    pool = DraftContextPool(model, max_tokens=64)
    h = pool.create_context()
    pool.append(h, taps, torch.arange(10))
    out = pool.propose([(h, 50, 10)])
    toks, probs, conf = ref_draft(W, cfg_d, taps, torch.arange(10), 50, 10, draft_vocab=sub)
    assert torch.equal(out.tokens[0], toks) and torch.isin(out.tokens, sub).all()
    assert out.probs.shape[-1] == cfg.vocab_size  # p_d over the target vocabulary, 0 outside the draft vocab
    torch.testing.assert_close(out.probs[0], probs, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.confidence[0], conf, rtol=0, atol=1e-12)
    # checkpoint: draft_vocab saved; lm_head rows re-derived from the target's full lm_head
    model.save_pretrained(tmp_path)
    loaded = DSparkDrafter.from_pretrained(tmp_path, target_embed=full.embed_tokens.weight.detach(),
                                           target_lm_head=full.lm_head.weight.detach(), dtype=F64)
    pool2 = DraftContextPool(loaded, max_tokens=64)
    h2 = pool2.create_context()
    pool2.append(h2, taps, torch.arange(10))
    o2 = pool2.propose([(h2, 50, 10)])
    assert_same_draft(o2, out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inference_optimized_drafter_drafts_the_same(dtype):
    """optimize_for_inference (prepacked and fused linears, fused RMSNorm, silu and argmax, the low-rank Markov kernel
    at small batch, the folded confidence head) changes the arithmetic, not the result: the same drafts and, to
    rounding, the same p_d and confidences, one sequence at a time and in batches of 3 and of 12 (past the
    low-rank kernel's batch limit); every third request with penalties."""
    cfg = make_cfg()
    plain, fast = make_model(cfg, dtype=dtype), make_model(cfg, dtype=dtype).optimize_for_inference()
    out = {}
    for name, model in (("plain", plain), ("fast", fast)):
        pool = DraftContextPool(model, max_tokens=512)
        reqs = []
        for i, n in enumerate([30, 3, 17, 5, 9, 12, 1, 40, 22, 8, 2, 15]):
            h = pool.create_context()
            pool.append(h, rand_taps(cfg, n, seed=10 + i, dtype=dtype), torch.arange(n))
            penalties = DraftPenalties(output=[i, 2 * i], prompt=[5], repetition_penalty=1.3, frequency_penalty=0.4,
                                       presence_penalty=0.3) if i % 3 == 0 else None
            reqs.append(DraftRequest(h, anchor_token=(7 * i) % 60, anchor_pos=n, penalties=penalties))
        out[name] = [pool.propose([r]) for r in reqs] + [pool.propose(reqs[:3]), pool.propose(reqs)]
    if dtype == torch.bfloat16:  # bf16 rounding differs between the paths, so near-ties may flip a draft
        same = sum(int((a.tokens == b.tokens).sum()) for a, b in zip(out["plain"], out["fast"]))
        assert same >= 0.8 * sum(a.tokens.numel() for a in out["plain"])
        return
    for a, b in zip(out["plain"], out["fast"]):
        assert torch.equal(a.tokens, b.tokens)
        torch.testing.assert_close(a.probs, b.probs, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(a.confidence, b.confidence, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_draft_layers_in_one_call_give_the_python_loops_bits(dtype):
    """With the CPU kernels, a draft round runs its layers as one C++ call (decoder_layers, as the target's decode
    step does); it must draft exactly what the Python loop over the same kernels drafts: the same tokens, p_d and
    confidences to the bit, at block row counts on each of Linear's paths."""
    from engine.ops import cpu_kernels

    if cpu_kernels() is None:
        pytest.skip("CPU kernels unavailable")
    cfg = make_cfg(head_dim=16, hidden_size=64, intermediate_size=128, block_size=7, attention_bias=True)
    model = make_model(cfg, dtype=dtype).optimize_for_inference()
    pool = DraftContextPool(model, max_tokens=2048)
    lens = [30, 3, 17, 5, 9, 12, 1, 40, 22, 8, 2, 15, 0, 33]
    reqs = []
    for i, n in enumerate(lens):
        h = pool.create_context()
        pool.append(h, rand_taps(cfg, n, seed=40 + i, dtype=dtype), torch.arange(n))
        reqs.append(DraftRequest(h, anchor_token=(7 * i) % 60, anchor_pos=n))
    for batch in (1, 2, 5, 14):
        rows = batch * cfg.block_size
        model._layer_args[rows] = None  # the Python loop
        python = pool.propose(reqs[:batch])
        del model._layer_args[rows]
        one_call = pool.propose(reqs[:batch])
        assert model._layer_args[rows] is not None, f"{rows} rows did not take the one-call loop"
        assert torch.equal(one_call.tokens, python.tokens)
        assert torch.equal(one_call.probs, python.probs)
        assert torch.equal(one_call.confidence, python.confidence)


# --------------------------------------------------------------------------- copy hints
def test_copy_hints_take_the_place_of_mask_tokens():
    """A drafter with copy_hint_ngram reads, at block position k >= 1, the hint for anchor + k instead of the mask
    token: its drafts are the reference's for the block input [anchor, hint..., mask...]. The engine sends gamma
    hint tokens, of which the last is never read; a short hint leaves mask tokens after it; no hint, all masks."""
    cfg = make_cfg(copy_hint_ngram=[2, 3])
    model = make_model(cfg)
    W, G, mask = weights(model), cfg.block_size, cfg.mask_token_id
    lens, anchors = [9, 1, 23, 14], [5, 17, 59, 0]
    hints = [[3, 4, 5, 6], [8, 9], None, []]
    taps = [rand_taps(cfg, n, seed=i) for i, n in enumerate(lens)]
    pool = DraftContextPool(model, max_tokens=256)
    hs = [pool.create_context() for _ in lens]
    pool.append_many([(h, t, torch.arange(len(t))) for h, t in zip(hs, taps)])
    hinted = pool.propose([DraftRequest(h, a, n, hint=hint) for h, a, n, hint in zip(hs, anchors, lens, hints)])
    masked = pool.propose([DraftRequest(h, a, n) for h, a, n in zip(hs, anchors, lens)])
    for b, (t, a, n, hint) in enumerate(zip(taps, anchors, lens, hints)):
        block = [a] + ((hint or [])[: G - 1] + [mask] * G)[: G - 1]
        toks, probs, conf = ref_draft(W, cfg, t, torch.arange(n), a, n, block_tokens=block)
        assert torch.equal(hinted.tokens[b], toks)
        torch.testing.assert_close(hinted.probs[b], probs, rtol=0, atol=1e-12)
        torch.testing.assert_close(hinted.confidence[b], conf, rtol=0, atol=1e-12)
        assert torch.equal(model.block_input_ids(torch.tensor([a]), torch.tensor([(hint or [])[: G - 1] + [-1] * G])),
                           torch.tensor([block]))
        changed = not torch.equal(hinted.probs[b], masked.probs[b])
        assert changed == bool(hint), b  # a hint changes the drafter's input, and so its p_d; none changes nothing


def test_a_drafter_without_copy_hints_ignores_them():
    cfg = make_cfg()
    model = make_model(cfg)
    pool = DraftContextPool(model, max_tokens=128)
    hs = [pool.create_context() for _ in range(2)]
    pool.append_many([(h, rand_taps(cfg, 7, seed=i), torch.arange(7)) for i, h in enumerate(hs)])
    hinted = pool.propose([DraftRequest(hs[0], 5, 7, hint=[3, 4, 5, 6]), DraftRequest(hs[1], 9, 7, hint=[1, 2])])
    plain = pool.propose([DraftRequest(hs[0], 5, 7), DraftRequest(hs[1], 9, 7)])
    assert torch.equal(hinted.tokens, plain.tokens) and torch.equal(hinted.probs, plain.probs)
    assert torch.equal(hinted.confidence, plain.confidence)
    ids = torch.tensor([5, 9])
    assert torch.equal(model.block_input_ids(ids, torch.tensor([[3, 4, 5], [1, 2, -1]])), model.block_input_ids(ids))
    # Requests for the same block share a backbone pass; hints it never reads cannot disagree.
    pool.propose([DraftRequest(hs[0], 5, 7, hint=[3, 4]), DraftRequest(hs[0], 5, 7, hint=[8])])


def test_requests_for_one_block_share_its_hint():
    """Several requests for the same block (context, anchor) share one backbone pass, so they must read the same
    hint (the same prefix gives the same lookup); a disagreement is a caller's bug and raises."""
    cfg = make_cfg(copy_hint_ngram=[2, 3])
    pool = DraftContextPool(make_model(cfg), max_tokens=64)
    h = pool.create_context()
    pool.append(h, rand_taps(cfg, 5, seed=1), torch.arange(5))
    alone = pool.propose([DraftRequest(h, 3, 5, hint=[7, 8, 9, 10])])
    twice = pool.propose([DraftRequest(h, 3, 5, hint=[7, 8, 9, 10]), DraftRequest(h, 3, 5, hint=[7, 8, 9, 11])])
    assert torch.equal(twice.tokens[0], alone.tokens[0]) and torch.equal(twice.tokens[1], alone.tokens[0])
    with pytest.raises(ValueError, match="differ in hint"):
        pool.propose([DraftRequest(h, 3, 5, hint=[7, 8, 9]), DraftRequest(h, 3, 5, hint=[7, 8])])


def test_draft_service_carries_hints_and_names_its_ngram_sizes():
    """DraftService (the engine's Drafter) passes each DraftWork's hint on to the drafter, and tells the engine the
    n-gram sizes of the hints it reads (None for a drafter that reads none)."""
    from draft_service.service import DraftService
    from engine.drafter import ContextSync, DraftWork

    cfg = make_cfg(copy_hint_ngram=[2, 3])
    model = make_model(cfg)
    service = DraftService(model, max_context_tokens=128)
    assert service.copy_hint_ngram == (2, 3)
    assert DraftService(make_model(make_cfg()), max_context_tokens=64).copy_hint_ngram is None
    taps = rand_taps(cfg, 6, seed=3)
    step = service.step([ContextSync("a", 0, taps), ContextSync("b", 0, taps)],
                        [DraftWork("a", 5, 6, hint=[3, 4, 5, 6]), DraftWork("b", 5, 6)])
    for row, block in ((0, [5, 3, 4, 5]), (1, [5] + [cfg.mask_token_id] * 3)):
        toks, _, conf = ref_draft(weights(model), cfg, taps, torch.arange(6), 5, 6, block_tokens=block)
        assert step.tokens[row] == toks.tolist()
        torch.testing.assert_close(torch.tensor(step.confidences[row], dtype=F64), conf, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("draft_vocab", [False, True])
def test_drafts_are_the_same_bits_alone_or_in_any_batch(dtype, draft_vocab):
    """Where the CPU kernels run the drafter batch-invariantly (issue 37), a sequence's drafts, p_d and confidences
    do not depend on the batch it is proposed in: alone, in batches of 3 and of 12 (past the low-rank kernel's
    4-row groups), greedy."""
    from engine.ops import cpu_kernels

    if cpu_kernels() is None or not cpu_kernels().has_linear_small():
        pytest.skip("CPU kernels unavailable")
    cfg = make_cfg(hidden_size=64, intermediate_size=128, head_dim=16)
    vocab = torch.arange(0, cfg.vocab_size, 2) if draft_vocab else None
    model = make_model(cfg, dtype=dtype, draft_vocab=vocab).optimize_for_inference()
    pool = DraftContextPool(model, max_tokens=1024)
    reqs = []
    for i, n in enumerate([30, 3, 17, 5, 9, 12, 1, 40, 22, 8, 2, 15]):
        h = pool.create_context()
        pool.append(h, rand_taps(cfg, n, seed=70 + i, dtype=dtype), torch.arange(n))
        reqs.append(DraftRequest(h, anchor_token=(5 * i) % 60, anchor_pos=n))
    alone = [pool.propose([r]) for r in reqs]
    for batch in (reqs[:3], reqs):
        together = pool.propose(batch)
        for b in range(len(batch)):
            assert torch.equal(together.tokens[b], alone[b].tokens[0])
            assert torch.equal(together.probs[b], alone[b].probs[0])
            assert torch.equal(together.confidence[b], alone[b].confidence[0])
