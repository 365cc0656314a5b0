"""The drafter campaign's durable state, on a tiny random target: answers go to the cache and into shards, a rerun
adds nothing, and a cache lost with its machine is rebuilt from the shards by transformers' own forward."""
from __future__ import annotations

import collections
import json

import numpy as np
import pytest
import torch

from draft_service import campaign
from draft_service.campaign import (Answer, cut_shards, featurize, load_manifest, plan_jobs, read_answers,
                                    run_generation, temperature_for, write_shard)
from draft_service.data import Cache
from engine import EngineConfig, LLMEngine
from tests.helpers import make_tiny_model

TAPS = [0, 2]


def test_shards_round_trip_and_refuse_a_changed_file(tmp_path):
    rng = np.random.default_rng(0)
    answers = [Answer(f"p{i}@0.7", rng.integers(0, 49152, size=10 + i), 4 + i % 3, 0.7) for i in range(5)]
    entry = write_shard(tmp_path, 0, answers)
    campaign.save_manifest(tmp_path, {"shards": [entry]})
    back = list(read_answers(tmp_path))
    assert [a.id for a in back] == [a.id for a in answers]
    for a, b in zip(answers, back):
        assert (a.token_ids == b.token_ids).all() and (a.prompt_len, a.temperature) == (b.prompt_len, b.temperature)
    assert entry["tokens"] == sum(len(a.token_ids) for a in answers)
    data = bytearray((tmp_path / entry["file"]).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / entry["file"]).write_bytes(bytes(data))
    with pytest.raises(ValueError, match="manifest"):
        list(read_answers(tmp_path))
    with pytest.raises(ValueError, match="uint16"):
        write_shard(tmp_path, 1, [Answer("big@0", np.array([70000]), 0, 0.0)])


def test_each_prompt_gets_one_stable_temperature_in_the_planned_mix():
    mix = [(0.0, 0.5), (0.7, 0.25), (1.0, 0.25)]
    temps = [temperature_for(f"mined-code-{i:06x}", mix) for i in range(20000)]
    assert temps == [temperature_for(f"mined-code-{i:06x}", mix) for i in range(20000)]
    share = collections.Counter(temps)
    for t, want in mix:
        assert abs(share[t] / len(temps) - want) < 0.02, share


def test_the_plan_interleaves_sets_so_any_prefix_mixes_them():
    sets = {"a": [{"id": f"a{i}"} for i in range(40)], "b": [{"id": f"b{i}"} for i in range(40)]}
    jobs = plan_jobs(sets, [(0.0, 0.5), (1.0, 0.5)], chunk=8)
    assert sorted(p["id"] for _, ps in jobs for p in ps) == sorted(p["id"] for s in sets.values() for p in s)
    first = jobs[:4]
    assert {ps[0]["id"][0] for _, ps in first} == {"a", "b"} and {t for t, _ in first} == {0.0, 1.0}
    for t, ps in jobs:
        assert all(temperature_for(p["id"], [(0.0, 0.5), (1.0, 0.5)]) == t for p in ps)


@pytest.fixture(scope="module")
def generated(tmp_path_factory, default_tokenizer):
    folder = tmp_path_factory.mktemp("campaign")
    model_dir = make_tiny_model("llama", folder / "target", default_tokenizer, initializer_range=0.5)
    engine = LLMEngine(EngineConfig(model=str(model_dir), dtype="float64", device="cpu", tap_layers=TAPS,
                                    kv_cache_memory_gb=0.05))
    words = ["cat", "dog", "sun", "tree", "blue", "run", "code", "math", "song", "rain"]
    prompts = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"{words[i % 10]} {words[(i * 3) % 10]}"}]}
               for i in range(14)]
    jobs = plan_jobs({"words": prompts}, [(0.0, 0.5), (1.0, 0.5)], chunk=4)
    info = {"target": "tiny", "target_dtype": "float64"}
    old = campaign.SHARD_ANSWERS
    campaign.SHARD_ANSWERS = 5
    try:
        run_generation(engine, folder, "train", jobs, max_tokens=12, info=info, log=lambda *_: None)
        cached_before = len(Cache(folder / "cache" / "train").samples)
        run_generation(engine, folder, "train", jobs, max_tokens=12, info=info, log=lambda *_: None)  # resumes: no-op
    finally:
        campaign.SHARD_ANSWERS = old
    return folder, model_dir, cached_before


def test_generation_puts_every_answer_in_the_cache_and_in_shards_once(generated):
    folder, _, cached_before = generated
    cache = Cache(folder / "cache" / "train")
    manifest = load_manifest(folder / "answers" / "train")
    assert cached_before == len(cache.samples) == 14  # the rerun added nothing
    assert [s["answers"] for s in manifest["shards"]] == [5, 5, 4]  # full shards as they fill, the rest at the end
    assert manifest["target_dtype"] == "float64" and all(len(s["engine_commit"]) >= 7 for s in manifest["shards"])
    answers = {a.id: a for a in read_answers(folder / "answers" / "train")}
    assert sorted(answers) == sorted(s.id for s in cache.samples)
    for s in cache.samples:
        a = answers[s.id]
        assert (a.token_ids == cache.tokens(s)).all() and a.prompt_len == s.prompt_len
        assert a.temperature == s.temperature and s.id.endswith(f"@{s.temperature:g}")
    # a second cut finds nothing new
    assert cut_shards(folder / "cache" / "train", folder / "answers" / "train", final=True) == 0


def test_featurize_rebuilds_the_cache_from_shards_as_the_engine_made_it(generated, tmp_path):
    from transformers import AutoModelForCausalLM

    folder, model_dir, _ = generated
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    assert featurize(folder / "answers" / "train", tmp_path / "rebuilt", target, TAPS, topk=32,
                     log=lambda *_: None) == 14
    assert featurize(folder / "answers" / "train", tmp_path / "rebuilt", target, TAPS, topk=32) == 0  # resumes
    engine_made, rebuilt = Cache(folder / "cache" / "train"), Cache(tmp_path / "rebuilt")
    by_id = {s.id: s for s in rebuilt.samples}
    for s in engine_made.samples:
        r = by_id[s.id]
        assert (rebuilt.tokens(r) == engine_made.tokens(s)).all() and r.temperature == s.temperature
        torch.testing.assert_close(rebuilt.taps(r).float(), engine_made.taps(s).float(), rtol=1e-2, atol=1e-2)
        ids_a, lp_a = engine_made.targets(s)
        ids_b, lp_b = rebuilt.targets(r)
        assert (ids_a[:, 0] == ids_b[:, 0]).all()
        np.testing.assert_allclose(lp_a[:, 0], lp_b[:, 0], atol=2e-2)
    assert json.loads((tmp_path / "rebuilt" / "meta.json").read_text())["topk"] == 32


def test_a_cache_read_while_featurize_writes_it_sees_whole_answers_only(generated, tmp_path):
    """Training with --follow reopens the cache while featurize appends: an index line still being written (no
    newline yet) is not an answer, and the answers before it read whole."""
    from transformers import AutoModelForCausalLM

    folder, model_dir, _ = generated
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    featurize(folder / "answers" / "train", tmp_path / "c", target, TAPS, topk=8, log=lambda *_: None)
    index = tmp_path / "c" / "index.jsonl"
    whole = index.read_text()
    index.write_text(whole + whole.splitlines()[0][:30])  # a writer mid-line
    cache = Cache(tmp_path / "c")
    assert len(cache.samples) == 14
    last = cache.samples[-1]
    assert cache.taps(last).shape[0] == last.n_tokens - 1 and len(cache.tokens(last)) == last.n_tokens
