"""Load/save drafters in DeepSpec's checkpoint layout.

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
from .model import DSparkDrafter

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


def load_drafter(path, *, target_embed=None, target_lm_head=None, dtype=None, device=None) -> DSparkDrafter:
    """Build a DSparkDrafter from a checkpoint dir.

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

    with torch.device("meta"):
        model = DSparkDrafter(cfg, draft_vocab=torch.empty(cfg.draft_vocab_size, dtype=torch.long)
                              if cfg.draft_vocab_size else None)
    expected = model.state_dict()
    for k, v in sd.items():
        if k in expected and tuple(expected[k].shape) != tuple(v.shape):
            raise ValueError(f"{k}: checkpoint shape {tuple(v.shape)} != config shape {tuple(expected[k].shape)}")
    model.load_state_dict(sd, strict=True, assign=True)  # raises on missing / unexpected names
    temps = load_temperatures(path)
    if temps is not None:
        if len(temps) != cfg.block_size:
            raise ValueError(f"{CALIBRATION_FILE} has {len(temps)} temperatures for block_size {cfg.block_size}")
        model.conf_temperatures = torch.tensor(temps, dtype=torch.float64, device=device)
    return model.requires_grad_(False).eval()


def save_drafter(model: DSparkDrafter, path: str, include_embeddings: bool = False,
                 dtype: torch.dtype | None = None) -> None:
    """Write config.json + model.safetensors (optionally cast, e.g. to bf16 for release)."""
    os.makedirs(path, exist_ok=True)
    cfg = model.config
    cfg.extra["dtype"] = str(dtype or model.dtype).removeprefix("torch.")
    cfg.to_json(os.path.join(path, "config.json"))
    out, seen = {}, set()
    for k, v in model.state_dict().items():
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
