"""Read/write drafter checkpoints in DeepSpec's layout (DSparkDrafter.from_pretrained / save_pretrained build the
model around them).

A DeepSpec checkpoint dir is HF `save_pretrained` output of Qwen3DSparkModel:
config.json + model.safetensors (or sharded, with model.safetensors.index.json),
tensor names without prefix: fc.weight, hidden_norm.weight, layers.N.self_attn.q_proj.weight, ...
DeepSpec stores frozen copies of the target's embed_tokens / lm_head; we may omit them
(include_embeddings=False) and take them from the target at load time.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .calibrate import CALIBRATION_FILE, load_temperatures
from .config import DSparkConfig

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
TARGET_SHARED = ("embed_tokens.weight", "lm_head.weight")
_PREFIXES = ("_orig_mod.", "model.")  # torch.compile / ForCausalLM-style wrappers


def _strip(name: str) -> str:
    for p in _PREFIXES:
        if name.startswith(p):
            name = name[len(p):]
    return name


def _weight_files(path: str) -> dict[str, str]:
    """Tensor name (as stored) -> file holding it."""
    index = os.path.join(path, INDEX_NAME)
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            return {k: os.path.join(path, v) for k, v in json.load(f)["weight_map"].items()}
    file = os.path.join(path, WEIGHTS_NAME)
    with safe_open(file, framework="pt") as f:
        return {k: file for k in f.keys()}


def read_checkpoint(path, *, target_embed=None, target_lm_head=None, dtype=None, device=None
                    ) -> tuple[DSparkConfig, dict[str, torch.Tensor], list[float] | None]:
    """A checkpoint dir's config, state dict (in `dtype`, on `device`) and calibrated confidence temperatures (None
    when it has none).

    embed_tokens / lm_head: the target's tensors when given (shared, not copied when dtype and
    device already match), else the checkpoint's copies; one of the two must exist.
    With a draft vocabulary, lm_head = target_lm_head[draft_vocab].
    """
    cfg = DSparkConfig.from_json(path)
    files = _weight_files(path)
    names = {_strip(k): k for k in files}
    if device is None:
        device = target_embed.device if target_embed is not None else "cpu"
    device = torch.device(device)
    targets = {"embed_tokens.weight": target_embed, "lm_head.weight": target_lm_head}

    handles: dict[str, object] = {}
    sd: dict[str, torch.Tensor] = {}
    try:
        for name, stored in names.items():
            if name in TARGET_SHARED and targets[name] is not None:
                continue  # the target's copy wins; don't even read the checkpoint's
            f = files[stored]
            if f not in handles:
                handles[f] = safe_open(f, framework="pt")
            sd[name] = handles[f].get_tensor(stored)
    finally:
        handles.clear()

    if dtype is None:
        dtype = sd["fc.weight"].dtype
    draft_vocab = sd.pop("draft_vocab", None)
    for name in TARGET_SHARED:
        t = targets[name]
        if t is not None:
            if name == "lm_head.weight" and draft_vocab is not None:
                t = t[draft_vocab.to(t.device)]
            sd[name] = t.detach()
        elif name not in sd:
            raise ValueError(f"{name} is neither in the checkpoint nor passed from the target")
    sd = {k: v.to(device=device, dtype=dtype) for k, v in sd.items()}
    if draft_vocab is not None:
        sd["draft_vocab"] = draft_vocab.to(device=device, dtype=torch.long)
    temps = load_temperatures(path)
    if temps is not None and len(temps) != cfg.block_size:
        raise ValueError(f"{CALIBRATION_FILE} has {len(temps)} temperatures for block_size {cfg.block_size}")
    return cfg, sd, temps


def write_checkpoint(path: str, cfg: DSparkConfig, state_dict: dict[str, torch.Tensor],
                     include_embeddings: bool = False, dtype: torch.dtype | None = None) -> None:
    """Write config.json + model.safetensors (optionally cast, e.g. to bf16 for release)."""
    os.makedirs(path, exist_ok=True)
    cfg.extra["dtype"] = str(dtype or state_dict["fc.weight"].dtype).removeprefix("torch.")
    cfg.to_json(os.path.join(path, "config.json"))
    out, seen = {}, set()
    for k, v in state_dict.items():
        if k in TARGET_SHARED and not include_embeddings:
            continue
        v = v.detach().to("cpu")
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype)
        v = v.contiguous()
        if v.data_ptr() in seen:  # e.g. tied target embed/lm_head; safetensors rejects shared storage
            v = v.clone()
        seen.add(v.data_ptr())
        out[k] = v
    save_file(out, os.path.join(path, WEIGHTS_NAME), metadata={"format": "pt"})
