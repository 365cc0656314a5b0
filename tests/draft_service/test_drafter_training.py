"""Drafter training and calibration, on a tiny random target (never the real drafter: that is trained offline)."""
from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest
import torch

from draft_service.calibrate import ece, fit_sts, survival
from draft_service.data import Cache, generate_cache
from draft_service.train import (LOSS_WEIGHTS, TrainConfig, block_losses, build_drafter, forward_blocks,
                                 local_index, make_batch, train)
from engine import EngineConfig, LLMEngine
from tests.helpers import make_tiny_model

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


def test_training_lowers_loss_and_resumes_exactly(tiny_caches):
    from transformers import AutoModelForCausalLM

    model_dir, cache, heldout, folder = tiny_caches
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
    resumed = train(target, cache, heldout, run, tc, TAPS, [2], log=lambda *_: None)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert any(not torch.equal(a, b) for a, b in zip(cut.state_dict().values(), resumed.state_dict().values()))


def test_warm_start_grows_layers_without_changing_the_drafter_then_trains_on(tiny_caches):
    from transformers import AutoModelForCausalLM

    from draft_service.model import DSparkDrafter
    from draft_service.train import warm_start

    model_dir, cache, heldout, folder = tiny_caches
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
