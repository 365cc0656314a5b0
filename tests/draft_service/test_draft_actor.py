"""The draft actor and its proxy: same drafts as the in-process service, target head read from safetensors, and an
engine that survives the actor dying (plain decoding meanwhile, contexts rebuilt after the restart)."""
from __future__ import annotations

import json
import os
import time

import pytest
import torch

from draft_service.actor import (DraftServiceProxy, draft_context_tokens, load_target_head,
                                 start_draft_actor)
from engine import EngineConfig, LLMEngine, SamplingParams
from tests.helpers import make_tiny_drafter, make_tiny_model, with_copy_hints

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_cluster():
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(num_cpus=4, object_store_memory=200 * 2**20, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def models(tmp_path_factory, default_tokenizer):
    folder = tmp_path_factory.mktemp("actor")
    target = make_tiny_model("llama", folder / "target", default_tokenizer)
    return target, make_tiny_drafter(folder / "drafter", len(default_tokenizer))


@pytest.fixture(scope="module")
def hinted_drafter(models, tmp_path_factory):
    """The tiny drafter, reading copy hints (by 2- and 3-grams)."""
    return with_copy_hints(models[1], tmp_path_factory.mktemp("actor-hinted") / "drafter", (2, 3))


def common(target):
    return dict(model=str(target), dtype="float64", device="cpu", kv_cache_memory_gb=0.05, max_num_seqs=4,
                max_num_batched_tokens=64)


def run_all(engine, prompts, params, on_step=None):
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    done, step = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        step += 1
        if on_step:
            on_step(step)
    return [done[f"r{i}"] for i in range(len(prompts))]


def test_target_head_is_read_from_safetensors(models, default_model_dir):
    from transformers import AutoModelForCausalLM

    target, _ = models
    embed, head = load_target_head(target, torch.float32)
    hf = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    assert torch.equal(embed, hf.model.embed_tokens.weight) and torch.equal(head, hf.lm_head.weight)
    embed, head = load_target_head(default_model_dir, torch.bfloat16)  # SmolLM2 ties them
    assert head is embed and embed.dtype == torch.bfloat16
    assert embed.shape[0] == json.loads((default_model_dir / "config.json").read_text())["vocab_size"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_packed_tap_rows_survive_serialization_exactly(dtype):
    """The proxy ships a round's tap rows as one numpy buffer (not one pickled tensor per sequence)."""
    from ray import cloudpickle

    from draft_service.actor import pack_syncs, unpack_syncs
    from engine.drafter import ContextSync

    rows = torch.randn(40, 12).to(dtype)
    syncs = [ContextSync("a", 3, rows[5:7]), ContextSync("b", 0, None), ContextSync("c", 9, rows[10:10]),
             ContextSync("d", 1, rows[20:25].t().contiguous().t())]  # a non-contiguous view too
    out = unpack_syncs(*cloudpickle.loads(cloudpickle.dumps(pack_syncs(syncs))))
    assert [(s.key, s.keep) for s in out] == [(s.key, s.keep) for s in syncs]
    assert out[1].taps is None and out[2].taps is None
    for i in (0, 3):
        assert out[i].taps.dtype == dtype and torch.equal(out[i].taps, syncs[i].taps)


@pytest.mark.parametrize("hinted", [False, True], ids=["plain", "copy-hints"])
def test_actor_drafts_equal_in_process_drafts(ray_cluster, models, request, hinted):
    """The same drafts through the actor as in process; with a drafter that reads copy hints, the hints travel to
    the actor and change its drafts there as they do in process."""
    from engine.drafter import ContextSync, DraftWork

    target, drafter = models
    if hinted:
        drafter = request.getfixturevalue("hinted_drafter")
    cfg = EngineConfig(**common(target), speculation="fixed:3")
    local = LLMEngine(cfg.model_copy(update={"drafter": str(drafter)}))
    actor = start_draft_actor(str(drafter), str(target), "float64", "cpu",
                              draft_context_tokens(target, cfg, torch.float64, torch.device("cpu")), num_cpus=1)
    proxy = DraftServiceProxy(actor)
    service = local.speculator.service
    assert (proxy.gamma, proxy.tap_layers) == (service.gamma, service.tap_layers)
    assert proxy.copy_hint_ngram == service.copy_hint_ngram == ((2, 3) if hinted else None)
    remote = LLMEngine(cfg, drafter_factory=lambda target: proxy)
    prompts = ["Hello there", "The quick brown fox", [5, 6, 7, 8, 9]]
    for params in (SamplingParams(max_tokens=20, ignore_eos=True),
                   SamplingParams(max_tokens=20, ignore_eos=True, temperature=0.9, seed=3, speculation="fixed:3")):
        want = run_all(local, prompts, params)
        got = run_all(remote, prompts, params)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        assert [o.metrics["num_draft_tokens"] for o in got] == [o.metrics["num_draft_tokens"] for o in want]
    assert remote.speculator.counters.fallbacks == 0 and remote.speculator.counters.draft_rounds > 0
    assert remote.speculator.hint_ngram == ((2, 3) if hinted else None)  # the engine computes hints for the actor
    # This random target's answers never repeat, so lookup has no hints for them: one round straight through the
    # proxy instead, a block read with a hint beside the same block read with mask tokens.
    taps = torch.randn(5, len(proxy.tap_layers) * 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    syncs = [ContextSync("hinted", 0, taps), ContextSync("masked", 0, taps)]
    work = [DraftWork("hinted", 7, 5, hint=[9, 10, 11]), DraftWork("masked", 7, 5)]
    there, here = proxy.step(syncs, work), service.step(syncs, work)
    assert there.tokens == here.tokens
    torch.testing.assert_close(torch.tensor(there.confidences), torch.tensor(here.confidences), rtol=0, atol=1e-12)
    gap = max(abs(a - b) for a, b in zip(*there.confidences))
    assert gap > 1e-9 if hinted else gap < 1e-12, gap  # the hint reached the drafter, which read it (if it reads any)
    proxy.release(["hinted", "masked"])
    service.release(["hinted", "masked"])
    assert proxy.stats()["live_contexts"] == 0
    ray.kill(actor, no_restart=True)


def test_engine_survives_the_actor_dying_and_rebuilds_contexts(ray_cluster, models):
    target, drafter = models
    cfg = EngineConfig(**common(target), speculation="fixed:3")
    plain = LLMEngine(cfg)
    actor = start_draft_actor(str(drafter), str(target), "float64", "cpu",
                              draft_context_tokens(target, cfg, torch.float64, torch.device("cpu")), num_cpus=1,
                              max_restarts=2)
    proxy = DraftServiceProxy(actor)
    engine = LLMEngine(cfg, drafter_factory=lambda target: proxy)
    spec = engine.speculator
    first = proxy.info["incarnation"]
    prompts = ["Hello there", "Once upon a time", "A B C"]
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    want = run_all(plain, prompts, params)
    events = {}

    def on_step(step):
        if step == 10:
            ray.kill(actor, no_restart=False)  # a crash: Ray restarts it
            events["killed"] = True
        elif events.get("killed") and spec.counters.fallbacks and "back" not in events:
            # The failed call (dead actor, or a new incarnation refusing the lost contexts) fell back to plain
            # decoding. Wait for the new incarnation, then let the speculator retry now rather than in 5 s.
            ray.wait([proxy.locator.pending], timeout=120)
            assert ray.get(actor.ping.remote(), timeout=120)["incarnation"] != first
            events["back"] = spec.counters.draft_rounds
            spec.disabled_until = 0.0

    got = run_all(engine, prompts, params, on_step)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]  # lossless through it all
    assert spec.counters.fallbacks >= 1 and "back" in events, (spec.counters, events)
    assert spec.counters.draft_rounds > events["back"]  # drafting resumed on rebuilt contexts
    assert proxy.stats()["live_contexts"] == 0
    ray.kill(actor, no_restart=True)


def test_actor_refuses_contexts_it_lost(ray_cluster, models):
    from engine.drafter import ContextSync, DraftWork

    target, drafter = models
    actor = start_draft_actor(str(drafter), str(target), "float64", "cpu", 4096, num_cpus=1)
    proxy = DraftServiceProxy(actor)
    width = len(proxy.tap_layers) * 64
    taps = torch.zeros(5, width, dtype=torch.float64)
    assert proxy.step([ContextSync("a", 0, taps)], [DraftWork("a", 7, 5)]) is not None
    with pytest.raises(Exception, match="the engine expects 3"):  # "b" was never built here
        proxy.step([ContextSync("b", 3, taps[:2])], [DraftWork("b", 7, 5)])
    # A failed call makes the proxy re-check the actor before the next one; it is alive, so this works.
    time.sleep(0.2)
    assert proxy.step([ContextSync("b", 0, taps)], [DraftWork("b", 7, 5)]) is not None
    proxy.release(["a", "b"])
    assert proxy.stats()["live_contexts"] == 0
    ray.kill(actor, no_restart=True)
