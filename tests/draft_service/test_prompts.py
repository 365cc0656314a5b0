"""The committed prompt sets in data/prompts: schema, sizes, split hygiene and exact reproducibility."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from draft_service.prompts import SPLITS, data_dir, load_prompts

GENERATOR = Path(__file__).resolve().parents[2] / "scripts" / "make_prompts.py"


@pytest.fixture(scope="module")
def make_prompts():
    """The generator script, imported from its path (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("make_prompts", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def committed() -> dict[str, list[dict]]:
    return {split: load_prompts(split) for split in SPLITS}


@pytest.fixture(scope="module")
def generated(make_prompts) -> list[dict]:
    return make_prompts.build_prompts()


def _user_texts(records: list[dict]) -> set[str]:
    return {rec["messages"][-1]["content"] for rec in records}


def _norm(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def test_files_exist_and_are_small():
    total = sum((data_dir() / f"{split}.jsonl").stat().st_size for split in SPLITS)
    assert total < 6 * 1024 * 1024


def test_schema(committed):
    ids = set()
    for split, records in committed.items():
        for rec in records:
            assert set(rec) == {"id", "category", "messages"}, rec
            assert isinstance(rec["id"], str) and rec["id"].startswith(f"{split}-{rec['category']}-")
            assert rec["id"] not in ids
            ids.add(rec["id"])
            msgs = rec["messages"]
            assert 1 <= len(msgs) <= 2
            assert msgs[-1]["role"] == "user"
            if len(msgs) == 2:
                assert msgs[0]["role"] == "system"
            for m in msgs:
                assert set(m) == {"role", "content"}
                assert isinstance(m["content"], str) and m["content"].strip() == m["content"] and m["content"]
                assert "{" not in m["content"] or "```" in m["content"] or split == "hard", m["content"]


def test_sizes_within_ten_percent(committed, make_prompts):
    for split, target in make_prompts.SIZES.items():
        assert abs(len(committed[split]) - target) <= 0.1 * target, (split, len(committed[split]))


def test_system_messages_are_a_varied_minority(committed):
    train = committed["train"]
    systems = [rec["messages"][0]["content"] for rec in train if len(rec["messages"]) == 2]
    assert 0.05 * len(train) <= len(systems) <= 0.15 * len(train)
    assert len(set(systems)) >= 20


def test_every_category_present(committed, make_prompts):
    TRAIN_CATEGORIES, HARD_CATEGORIES = make_prompts.TRAIN_CATEGORIES, make_prompts.HARD_CATEGORIES
    for split in ("train", "heldout"):
        cats = {rec["category"] for rec in committed[split]}
        assert cats == set(TRAIN_CATEGORIES), (split, cats ^ set(TRAIN_CATEGORIES))
    assert len(TRAIN_CATEGORIES) >= 12
    assert {rec["category"] for rec in committed["hard"]} == set(HARD_CATEGORIES)
    assert not set(HARD_CATEGORIES) & set(TRAIN_CATEGORIES)


def test_no_prompt_shared_between_splits(committed):
    texts = {split: _user_texts(recs) for split, recs in committed.items()}
    for split, recs in committed.items():
        assert len(texts[split]) == len(recs), f"duplicate prompt inside {split}"
    assert not texts["train"] & texts["heldout"]
    assert not texts["train"] & texts["hard"]
    assert not texts["heldout"] & texts["hard"]
    normed = {split: {_norm(t) for t in ts} for split, ts in texts.items()}
    assert not normed["train"] & normed["heldout"]
    assert not normed["train"] & normed["hard"]


def test_regeneration_reproduces_committed_files(committed, generated):
    for split in SPLITS:
        regen = [{k: rec[k] for k in ("id", "category", "messages")} for rec in generated if rec["split"] == split]
        assert regen == committed[split], f"{split}.jsonl is stale: run python scripts/make_prompts.py"


def test_generator_writes_the_splits_that_load_prompts_reads(make_prompts):
    assert make_prompts.SPLITS == SPLITS


def test_written_files_are_byte_identical(tmp_path, generated, make_prompts):
    paths = make_prompts.write_prompts(generated, tmp_path)
    for split, path in paths.items():
        assert path.read_bytes() == (data_dir() / f"{split}.jsonl").read_bytes(), split


def test_other_seed_differs(make_prompts):
    other = make_prompts.build_prompts(seed=1)
    assert len(other) == sum(make_prompts.SIZES.values())
    assert _user_texts(other) != _user_texts(load_prompts("train") + load_prompts("heldout") + load_prompts("hard"))
