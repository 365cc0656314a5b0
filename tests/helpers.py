"""Builders shared by the tests (and bench/reliability.py): tiny random-init models written as real HF folders, a
tiny DSpark drafter, and transformers' own greedy generate as the reference."""
from __future__ import annotations

from pathlib import Path

import torch

from draft_service.config import DSparkConfig
from draft_service.model import DSparkDrafter

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


def make_tiny_drafter(folder, vocab_size: int, taps=(0, 2), copy_hint_ngram: list[int] | None = None):
    """Save a random-init one-layer DSpark drafter over the tiny target's taps to `folder` and return it (reading
    copy hints by n-grams of sizes `copy_hint_ngram` when given)."""
    cfg = DSparkConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                       block_size=4, target_layer_ids=list(taps), mask_token_id=0, markov_rank=8,
                       markov_head_type="vanilla", enable_confidence_head=True, confidence_head_with_markov=True,
                       copy_hint_ngram=copy_hint_ngram)
    torch.manual_seed(0)
    DSparkDrafter(cfg).init_weights().save_pretrained(folder)
    return folder


def with_copy_hints(drafter_dir: Path, folder: Path, ngram=(2, 3)) -> Path:
    """A copy of the drafter in `drafter_dir` at `folder`, the same weights, that reads copy hints by n-grams of
    sizes `ngram` (config copy_hint_ngram) where it read mask tokens."""
    import json
    import shutil

    folder = Path(folder)
    shutil.copytree(drafter_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["copy_hint_ngram"] = list(ngram)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


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
