"""Shared fixtures: tiny random-init models of each supported family, written as real HF folders, and the default
model's converted folder."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, initializer_range=0.2,
            rms_norm_eps=1e-6)


def make_tiny_model(family: str, folder: Path, tokenizer=None, vocab_size: int | None = None, seed: int = 0,
                    **overrides) -> Path:
    """Save a random-init model of `family` (llama, mistral, qwen2, qwen3) to `folder` and return it."""
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    cls = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[family]
    kwargs = dict(TINY, vocab_size=vocab_size or (len(tokenizer) if tokenizer is not None else 512))
    kwargs.update(bos_token_id=1, eos_token_id=2, pad_token_id=2)
    if family == "mistral":
        kwargs["sliding_window"] = None
    kwargs.update(overrides)
    config = cls(**kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


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


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int, dtype=torch.float64,
              stop_at_eos: bool = False) -> list[list[int]]:
    """Reference: transformers' own generate, one prompt at a time (no padding effects)."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    gen = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False,
                           eos_token_id=model.config.eos_token_id if stop_at_eos else None, pad_token_id=0)
    outs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen)
            outs.append(out[0, len(p):].tolist())
    return outs
