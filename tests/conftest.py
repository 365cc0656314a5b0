"""Session fixtures: the default model's folder and tokenizer, and a tiny Llama with that tokenizer."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import make_tiny_model

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    from engine.loader import resolve_model

    return resolve_model(None)


@pytest.fixture(scope="session")
def default_tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, default_tokenizer):
    """A tiny Llama with the default model's tokenizer (so text prompts and stop strings work)."""
    return make_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama"), default_tokenizer)
