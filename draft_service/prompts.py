"""The offline prompt sets for training and benchmarking the DSpark drafter of SmolLM2-135M-Instruct.

Each split is a committed ``data/prompts/{split}.jsonl`` file of chat records ``{"id", "category", "messages"}``:
train (drafter training), heldout (in-domain evaluation) and hard (an out-of-domain mix for benchmarks). The
target model writes the responses itself, so these are prompts only. ``scripts/make_prompts.py`` generated them;
data/prompts/README.md describes the categories and how the splits are kept apart.
"""
from __future__ import annotations

import json
from pathlib import Path

SPLITS = ("train", "heldout", "hard")


def data_dir() -> Path:
    """``data/prompts`` of the repository that holds this module."""
    return Path(__file__).resolve().parent.parent / "data" / "prompts"


def load_prompts(split: str = "train", path: Path | str | None = None) -> list[dict]:
    """Read the committed ``data/prompts/{split}.jsonl`` (or `path`) as a list of records."""
    if split not in SPLITS and path is None:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    path = Path(path) if path is not None else data_dir() / f"{split}.jsonl"
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
