"""Drafter training and calibration, on a tiny random target (never the real drafter: that is trained offline)."""
from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest
import torch

from draft_service.calibrate import ece, fit_sts, survival
from draft_service.data import Cache, CacheWriter, generate_cache
from draft_service.model import DSparkDrafter
from draft_service.train import (LOSS_WEIGHTS, TrainConfig, block_losses, build_drafter, evaluate, forward_blocks,
                                 export_checkpoint, local_index, lr_at, make_batch, train, warm_start)
from engine import EngineConfig, LLMEngine
from engine.ngram import NgramIndex
from tests.helpers import make_tiny_model

pytestmark = pytest.mark.usefixtures("kernels")  # each test on the CPU kernels and on the torch ops

TAPS = [0, 2]


@pytest.fixture(scope="module")
def tiny_caches(tmp_path_factory, default_tokenizer):
    folder = tmp_path_factory.mktemp("tiny-train")
    model_dir = make_tiny_model("llama", folder / "target", default_tokenizer, initializer_range=0.5)
    engine = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", device="cpu", tap_layers=TAPS,
                                    kv_cache_memory_gb=0.05))
    words = ["cat", "dog", "sun", "tree", "blue", "run", "code", "math", "song", "rain", "star", "fish"]
    prompts = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"{words[i % 12]} {words[(i * 5) % 12]}"}]}
               for i in range(40)]
    generate_cache(engine, prompts[:32], folder / "train", temperatures=[0.0, 1.0], max_tokens=24, topk=8)
    generate_cache(engine, prompts[32:], folder / "heldout", temperatures=[0.0], max_tokens=24, topk=8)
    return model_dir, Cache(folder / "train"), Cache(folder / "heldout"), folder


def test_cache_holds_what_the_target_computed(tiny_caches):
    from transformers import AutoModelForCausalLM

    model_dir, cache, _, _ = tiny_caches
    assert len(cache.samples) == 64
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    s = cache.samples[3]
    tokens = torch.from_numpy(cache.tokens(s).astype(np.int64))
    with torch.no_grad():
        out = ref(tokens[None, :-1], output_hidden_states=True)
    want = torch.cat([out.hidden_states[t + 1][0] for t in TAPS], -1)
    torch.testing.assert_close(cache.taps(s).float(), want, rtol=1e-2, atol=1e-2)  # stored in bf16
    ids, logp = cache.targets(s)
    ref_lp = torch.log_softmax(out.logits[0, s.prompt_len - 1:], -1)
    assert (ids[:, 0] == ref_lp.argmax(-1).numpy()).all()
    np.testing.assert_allclose(logp[:, 0], ref_lp.max(-1).values.numpy(), atol=2e-2)


def fixed_loss(model, cache) -> float:
    """The training loss on fixed anchors of the first 16 answers."""
    rng, to_local, total = random.Random(0), local_index(model), 0.0
    with torch.no_grad():
        for s in cache.samples[:16]:
            b = make_batch(cache, s, 8, model.gamma, to_local, rng)
            _, logits, conf = forward_blocks(model, b)
            losses = block_losses(logits, conf, b)
            total += sum(LOSS_WEIGHTS[k] * losses[k].item() for k in LOSS_WEIGHTS)
    return total


def test_training_lowers_loss_and_resumes_exactly(tiny_caches, tmp_path):
    from transformers import AutoModelForCausalLM

    model_dir, cache, heldout, _ = tiny_caches
    folder = tmp_path  # runs of its own: a run folder that holds a checkpoint resumes from it
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tc = TrainConfig(steps=60, samples_per_step=4, anchors_per_sample=8, draft_vocab_size=1024, lr=5e-3,
                     eval_every=60, checkpoint_every=20, mask_token_id=3)
    straight = train(target, cache, heldout, folder / "straight", tc, TAPS, [2], log=lambda *_: None)
    initial = build_drafter(target, tc, TAPS, straight.draft_vocab)
    before, after = fixed_loss(initial, cache), fixed_loss(straight, cache)
    assert after < 0.85 * before, (before, after)
    hist = json.loads((folder / "straight" / "history.json").read_text())
    assert hist[-1]["eval_tau"] >= 1.0
    # A run cut short at step 20 and resumed ends with the same weights as the straight run.
    run = folder / "resumed"
    cut = train(target, cache, heldout, run, tc, TAPS, [2], log=lambda *_: None, stop_after=20)
    assert not (run / "drafter").exists()
    # The cut run's checkpoint, exported as a drafter folder, loads as the drafter the run had at that step.
    summary = export_checkpoint(target, run / "checkpoint.pt", tmp_path / "exported", TAPS, dtype=None)
    exported = DSparkDrafter.from_pretrained(tmp_path / "exported", target_embed=target.get_input_embeddings().weight,
                                             target_lm_head=target.get_output_embeddings().weight)
    assert summary["step"] == 20
    for (name, a), b in zip(cut.state_dict().items(), exported.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    resumed = train(target, cache, heldout, run, tc, TAPS, [2], log=lambda *_: None)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert any(not torch.equal(a, b) for a, b in zip(cut.state_dict().values(), resumed.state_dict().values()))
    # A run whose folder is gone goes on from its weights-only snapshot (the export): the step count, and with it
    # the learning rate, carries over; the weights start as the snapshot's.
    snap = dataclasses.replace(tc, init_from=str(tmp_path / "exported"))
    at_start = train(target, cache, heldout, folder / "from-snapshot", snap, TAPS, [2], log=lambda *_: None,
                     start_step=20, stop_after=20)
    for (name, a), b in zip(cut.state_dict().items(), at_start.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    train(target, cache, heldout, folder / "from-snapshot", snap, TAPS, [2], log=lambda *_: None, start_step=20,
          stop_after=40)
    ckpt = torch.load(folder / "from-snapshot" / "checkpoint.pt", weights_only=False)
    assert ckpt["step"] == 40 and [h["step"] for h in ckpt["history"]] == list(range(21, 41))
    assert ckpt["history"][0]["lr"] == lr_at(20, tc)


def test_warm_start_grows_layers_without_changing_the_drafter_then_trains_on(tiny_caches, tmp_path):
    from transformers import AutoModelForCausalLM

    from draft_service.model import DSparkDrafter
    from draft_service.train import warm_start

    model_dir, cache, heldout, _ = tiny_caches
    folder = tmp_path
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tc = TrainConfig(steps=40, samples_per_step=4, anchors_per_sample=8, draft_vocab_size=1024, lr=5e-3,
                     eval_every=40, checkpoint_every=40, mask_token_id=3)
    small = train(target, cache, heldout, folder / "one-layer", tc, TAPS, [2], log=lambda *_: None)
    saved = folder / "one-layer" / "drafter"
    base = DSparkDrafter.from_pretrained(saved, target_embed=target.get_input_embeddings().weight,
                                         target_lm_head=target.get_output_embeddings().weight, dtype=torch.float32)
    grown_tc = dataclasses.replace(tc, layers=2, steps=30, init_from=str(saved))
    grown = warm_start(build_drafter(target, grown_tc, TAPS, base.draft_vocab), base)
    assert len(grown.layers) == 2
    b = make_batch(cache, cache.samples[5], 8, grown.gamma, local_index(grown), random.Random(1))
    with torch.no_grad():
        _, want, want_c = forward_blocks(small, b)
        _, got, got_c = forward_blocks(grown, b)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)  # the extra layer starts as an identity
    torch.testing.assert_close(got_c, want_c, rtol=0, atol=1e-5)
    trained = train(target, cache, heldout, folder / "two-layer", grown_tc, TAPS, [2], log=lambda *_: None)
    assert len(trained.layers) == 2 and trained.layers[1].mlp.down_proj.weight.abs().sum() > 0
    assert fixed_loss(trained, cache) < fixed_loss(small, cache)
    with pytest.raises(ValueError, match="cannot warm-start"):
        warm_start(build_drafter(target, tc, TAPS, base.draft_vocab), trained)


def test_sts_recovers_temperature_lowers_ece_and_keeps_order():
    rng = np.random.default_rng(0)
    N, G, true_t = 20000, 5, np.array([2.0, 0.5, 3.0, 1.0, 1.5])
    z = rng.normal(1.0, 2.0, size=(N, G))
    # Ground truth: position k is accepted with probability sigmoid(z_k / T_k), given the prefix survived.
    ok = rng.random((N, G)) < 1 / (1 + np.exp(-z / true_t))
    y = np.cumprod(ok, axis=1).astype(float)
    valid = np.ones((N, G), bool)
    half, held = slice(0, N // 2), slice(N // 2, N)
    fit = fit_sts((z[half], y[half], valid[half]), (z[held], y[held], valid[held]))
    temps = np.array(fit["temperatures"])
    np.testing.assert_allclose(temps, true_t, rtol=0.2)
    before = [ece(survival(z[held], np.ones(G))[:, k], y[held, k]) for k in range(G)]
    after = [ece(survival(z[held], temps)[:, k], y[held, k]) for k in range(G)]
    assert sum(after) < 0.5 * sum(before)
    c_before, c_after = 1 / (1 + np.exp(-z)), 1 / (1 + np.exp(-z / temps))
    for k in range(G):
        assert (np.argsort(c_before[:, k], kind="stable") == np.argsort(c_after[:, k], kind="stable")).all()


# -- copy hints ---------------------------------------------------------------------------------------------------
COPY_VOCAB = 32


def write_copy_cache(folder, n_samples: int, seed: int, width: int) -> Cache:
    """Answers that copy a span of their prompt (then two random tokens), as a target that quotes would give. A
    position's tap is a fixed random vector of its token: the context says which tokens came before, not what
    follows them, so only the copy hints tell a one-layer drafter what the copy goes on with."""
    rng = random.Random(seed)
    tap_of = torch.randn(COPY_VOCAB, width, generator=torch.Generator().manual_seed(1234))
    writer = CacheWriter(folder, width, topk=4)
    for i in range(n_samples):
        prompt = [rng.randrange(3, COPY_VOCAB) for _ in range(rng.randint(12, 20))]
        span = rng.randint(8, 12)
        start = rng.randrange(len(prompt) - span + 1)
        tokens = prompt + prompt[start: start + span] + [rng.randrange(3, COPY_VOCAB) for _ in range(2)]
        writer.add(f"c{i}", tokens, len(prompt), tap_of[torch.tensor(tokens[:-1])],
                   [{t: 0.0} for t in tokens[len(prompt):]], 0.0)  # the target is sure of the next token
    writer.close()
    return Cache(folder)


@pytest.fixture(scope="module")
def copy_caches(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("copy-train")
    model_dir = make_tiny_model("llama", folder / "target", vocab_size=COPY_VOCAB, tie_word_embeddings=True)
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        # A direction every token's embedding shares, as a trained model's do (a random init has none): attending to
        # "the next position, whatever its token" needs it. Tied, it adds the same to every logit: softmax unchanged.
        target.get_input_embeddings().weight += 0.2 * torch.randn(target.config.hidden_size,
                                                                  generator=torch.Generator().manual_seed(7))
    width = len(TAPS) * target.config.hidden_size
    return (target, write_copy_cache(folder / "train", 1024, 0, width),
            write_copy_cache(folder / "heldout", 48, 1, width))


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same float sums on every machine, and no contention with other jobs
    yield
    torch.set_num_threads(threads)


def paged_block_hidden(model, taps, anchors, anchor_ids, hints):
    """The inference path: each anchor's context (taps before it) in a DraftContextPool, and block_hidden_paged over
    the pool's pages, set up as DraftContextPool.propose sets it up (block slots lent just past each context)."""
    from draft_service.context import DraftContextPool
    from engine.attention import build_metadata

    cfg, G = model.config, model.gamma
    pool = DraftContextPool(model, max_tokens=len(anchors) * (taps.shape[0] + 2 * G + 32), kernels=False)
    tables, lens = [], []
    for p in anchors.tolist():
        handle = pool.create_context()
        pool.append(handle, taps[:p], torch.arange(p))
        ctx = pool._get(handle)
        while len(ctx.pages) * pool.page_size < ctx.length + G:
            ctx.pages.append(pool._free.pop())
        tables.append(ctx.pages)
        lens.append(ctx.length)
    meta = build_metadata([(G, n, t) for n, t in zip(lens, tables)], pool.page_size,
                          cfg.num_attention_heads // cfg.num_key_value_heads, model.device,
                          backend=pool.ops.attention, causal=False, num_cache_blocks=pool.cache.num_blocks)
    return model.block_hidden_paged(anchor_ids, anchors, meta, pool.cache, pool.ops, hints)


@pytest.mark.parametrize("hint_ngram", [None, [2, 3]])
def test_training_blocks_compute_what_inference_drafts(copy_caches, hint_ngram):
    """forward_blocks (all anchors of a sample at once, context by mask) gives the hidden states that the pool's paged
    path gives each anchor alone; with copy hints both read the same lookup proposals."""
    target, cache, _ = copy_caches
    tc = TrainConfig(gamma=5, markov_rank=8, draft_vocab_size=COPY_VOCAB, mask_token_id=1, copy_hint_ngram=hint_ngram)
    model = build_drafter(target, tc, TAPS, torch.arange(COPY_VOCAB)).eval()
    s = cache.samples[7]
    b = make_batch(cache, s, 64, model.gamma, local_index(model), random.Random(0), hint_ngram=hint_ngram)
    if hint_ngram is None:
        assert b.hints is None
    else:  # the lookup's proposals, read where they exist and masks elsewhere
        tokens = cache.tokens(s).tolist()
        for p, row in zip(b.anchors.tolist(), b.hints.tolist()):
            want = NgramIndex(*hint_ngram).propose(tokens[: p + 1], model.gamma)[0]
            assert row == (want or [-1] * model.gamma)
        ids = model.block_input_ids(b.block_ids[:, 0], b.hints)
        assert (ids[:, 1:] != tc.mask_token_id).any() and (ids[:, 1:] == tc.mask_token_id).any()
    with torch.no_grad():
        want, _, _ = forward_blocks(model, b)
    got = paged_block_hidden(model, b.taps, b.anchors, b.block_ids[:, 0], b.hints)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    if hint_ngram is not None:  # the hints change what the block computes
        with torch.no_grad():
            masked = paged_block_hidden(model, b.taps, b.anchors, b.block_ids[:, 0], None)
        assert (masked - got).abs().max() > 1e-2


def test_copy_hints_teach_the_drafter_to_copy(copy_caches, tmp_path, one_thread):
    """On answers that quote their prompt, a drafter trained with copy hints drafts far longer accepted runs than
    the same drafter trained (same seed, same steps) without them. The hint run is cut short and resumed from its
    checkpoint with a config that lacks hints: the checkpoint's config (hints included) wins."""
    target, cache, heldout = copy_caches
    tc = TrainConfig(gamma=4, markov_rank=16, draft_vocab_size=COPY_VOCAB, anchors_per_sample=16, samples_per_step=4,
                     steps=200, lr=1e-2, eval_every=10**6, checkpoint_every=10**6, mask_token_id=1)
    quiet = dict(log=lambda *_: None)
    plain = train(target, cache, None, tmp_path / "plain", tc, TAPS, [2], **quiet)
    hinted_tc = dataclasses.replace(tc, copy_hint_ngram=[2, 3])
    train(target, cache, None, tmp_path / "hints", hinted_tc, TAPS, [2], stop_after=100, **quiet)
    hinted = train(target, cache, None, tmp_path / "hints", tc, TAPS, [2], **quiet)
    assert plain.config.copy_hint_ngram is None and hinted.config.copy_hint_ngram == [2, 3]
    saved = DSparkDrafter.from_pretrained(tmp_path / "hints" / "drafter", dtype=torch.float32,
                                          target_embed=target.get_input_embeddings().weight,
                                          target_lm_head=target.get_output_embeddings().weight)
    assert saved.config.copy_hint_ngram == [2, 3]
    tau_plain = evaluate(plain, heldout, heldout.samples, local_index(plain))["tau"]
    tau_hinted = evaluate(hinted, heldout, heldout.samples, local_index(hinted))["tau"]
    assert tau_hinted > tau_plain + 1.0, (tau_plain, tau_hinted)
    # A drafter trained without hints warm-starts one with them: same weights, and the hints change its drafts.
    grown = warm_start(build_drafter(target, hinted_tc, TAPS, plain.draft_vocab), plain)
    for (name, a), b in zip(plain.state_dict().items(), grown.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
