"""Fused ops of the decode path: C++ kernels on the CPU (engine/csrc), plain PyTorch elsewhere.

The kernels are compiled on first use with torch's JIT extension builder and cached in TORCH_EXTENSIONS_DIR. Set
DSPARK_KERNELS=torch to use the PyTorch versions everywhere (also the fallback when no compiler is present).
DSPARK_ATTENTION=kernel|flex|sdpa picks the paged attention (engine/attention.py); by default the kernel where the
CPU kernels run, flex_attention on a GPU, else SDPA over gathered blocks.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
from pathlib import Path

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)
_SOURCE = Path(__file__).parent / "csrc" / "cpu_kernels.cpp"
_kernels = None
_loaded = False


def cpu_kernels():
    """The compiled kernel module, or None where it is disabled or cannot be built."""
    global _kernels, _loaded
    if not _loaded:
        _loaded = True
        if os.environ.get("DSPARK_KERNELS", "auto") != "torch":
            try:
                from torch.utils.cpp_extension import load

                # -fno-trapping-math: under the default, GCC keeps any loop with a float compare (the clamp in the
                # kernels' exp, a sign select) scalar, as the compare could raise an FP exception nobody reads; the
                # softmax of attention and silu_mul then ran scalar, slower than eager PyTorch.
                _kernels = load(name=f"dspark_cpu_kernels_{_cpu_tag()}", sources=[str(_SOURCE)],
                                extra_cflags=["-O3", "-march=native", "-fno-trapping-math", "-fopenmp"],
                                extra_ldflags=["-fopenmp"])
            except Exception as exc:  # no compiler, no ninja: keep serving on the PyTorch path
                log.warning("CPU kernels unavailable, using PyTorch ops: %s", exc)
    return _kernels


@functools.cache  # read once: drafter training asks per sample whether to autocast
def cpu_flags() -> frozenset[str]:
    """This CPU's instruction-set flags from /proc/cpuinfo (x86 "flags", Arm "Features"); empty where unreadable."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return frozenset()
    return frozenset(line.partition(":")[2].split())


def _cpu_tag() -> str:
    """A short hash of this CPU's instruction-set flags. The kernels build with -march=native, and torch caches a
    build by name and source only: a home directory shared by unlike machines (a Ray cluster's NFS home, an image
    moved to another host) would otherwise load AVX-512 code on an AVX2-only CPU and die of SIGILL."""
    return hashlib.sha1(f"{platform.machine()} {' '.join(sorted(cpu_flags()))}".encode()).hexdigest()[:10]


def lowrank_chunks(w2t: torch.Tensor) -> torch.Tensor:
    """W2^T [R, V] as the low-rank kernels read it (add_lowrank_, markov_greedy): [ceil(V / 64), R, 64], each
    64-wide slice of the output's weights one contiguous run, the last zero-padded (64: kLowrankChunk in csrc)."""
    R, V = w2t.shape
    return F.pad(w2t, (0, -V % 64)).view(R, -1, 64).transpose(0, 1).contiguous()


class Ops:
    """Picks an implementation once per engine: `Ops(device)`. Both implementations have the same semantics."""

    def __init__(self, device: torch.device, block_size: int = 16, head_dim: int = 64, kernels: bool = True):
        """`kernels=False`: the PyTorch ops even where the CPU kernels build."""
        # The attention kernel works on 16-wide register tiles of keys and head dims.
        usable = kernels and device.type == "cpu" and block_size % 16 == 0 and head_dim % 16 == 0
        self.k = cpu_kernels() if usable else None
        self.attention = self._pick_attention(device, block_size)

    @property
    def fused(self) -> bool:
        return self.k is not None

    def _pick_attention(self, device: torch.device, block_size: int) -> str:
        """The paged attention backend (engine.attention.BACKENDS): DSPARK_ATTENTION where it can run, else the
        kernel where the CPU kernels run, flex_attention on a GPU, SDPA elsewhere."""
        choice = os.environ.get("DSPARK_ATTENTION", "auto")
        if choice not in ("auto", "kernel", "flex", "sdpa"):
            raise ValueError(f"DSPARK_ATTENTION={choice!r}: expected auto, kernel, flex or sdpa")
        flex_ok = block_size % 16 == 0  # flex_attention's GPU kernels tile keys by at least 16
        if choice == "flex" and flex_ok:
            return "flex"
        if choice in ("auto", "kernel") and self.k is not None:
            return "kernel"
        if choice == "auto" and flex_ok and device.type == "cuda":
            from engine.attention import flex_unavailable

            if (why := flex_unavailable(device.type)) is None:
                return "flex"
            log.warning("paged attention falls back to SDPA over gathered blocks: %s", why)
        return "sdpa"

    def key_layout(self, dtype: torch.dtype) -> str:
        """The K cache layout the attention reads (engine.attention.KVCache)."""
        if self.attention != "kernel":
            return "plain"
        return "paired" if dtype == torch.bfloat16 and self.k.paired_keys() else "transposed"

    def rms_norm(self, x, w, eps):
        if self.k is not None:
            return self.k.rms_norm(x, w, eps)
        return F.rms_norm(x, (x.shape[-1],), w, eps)

    def add_rms_norm(self, x, residual, w, eps):
        """residual += x in place; returns rms_norm(residual)."""
        if self.k is not None:
            return self.k.add_rms_norm(x, residual, w, eps)
        residual.add_(x)
        return F.rms_norm(residual, (residual.shape[-1],), w, eps)

    def silu_mul(self, gate_up):
        if self.k is not None and gate_up.is_contiguous():
            return self.k.silu_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def argmax(self, x):
        """Row-wise argmax; torch.argmax is several times slower than a plain max on the CPU."""
        if self.k is not None and x.is_contiguous():
            return self.k.argmax_rows(x)
        return x.argmax(dim=-1)

    def rope_and_cache(self, qkv, cos, sin, slots, k_cache, v_cache, num_heads, num_kv_heads, q_norm, k_norm, eps):
        """Returns q [T, H, D] after the optional q/k norm and RoPE; writes k and v into the caches."""
        if self.attention == "kernel":  # the kernel writes K in the kernel attention's layouts
            return self.k.rope_and_cache(qkv, cos, sin, slots, k_cache, v_cache, num_heads, num_kv_heads,
                                         q_norm, k_norm, eps)
        T, D = qkv.shape[0], k_cache.shape[-1]
        q, k, v = qkv.split([num_heads * D, num_kv_heads * D, num_kv_heads * D], dim=-1)
        q, k, v = q.view(T, num_heads, D), k.view(T, num_kv_heads, D), v.view(T, num_kv_heads, D)
        if q_norm is not None:
            q, k = F.rms_norm(q, (D,), q_norm, eps), F.rms_norm(k, (D,), k_norm, eps)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        k_cache.view(-1, num_kv_heads, D).index_copy_(0, slots, k)
        v_cache.view(-1, num_kv_heads, D).index_copy_(0, slots, v)
        return q


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
