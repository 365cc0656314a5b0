"""A packed, paged forward pass for Llama-family decoders (Llama, Mistral, Qwen2, Qwen3).

The weights come from the transformers model (`engine.loader.load_hf_model`); only the forward is ours.
transformers' own forward spends several times this loop's overhead per decode step outside its linear layers, in
per-layer mask, cache and kwargs machinery. So the engine runs its own short loop over the same weights, with q/k/v
and gate/up fused, one packed token dimension (no batch padding) and paged K/V. On the CPU, a step of decodes and
verify segments (no prefill chunk) takes that loop as one C++ call (decoder_layers in engine/csrc): the same kernels
and GEMMs in the same order.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.attention import SMALL_QUERY, AttentionMetadata, KVCache, paged_attention
from engine.ops import Ops, cpu_kernels

# What runs a Linear (Linear.call_args), numbered as engine/csrc's LinearKernel, which decoder_layers reads.
LINEAR_SMALL, LINEAR_SMALL_Q8, LINEAR_BF16, LINEAR_ONEDNN, LINEAR_ONEDNN_WIDENED, LINEAR_PANELS = range(6)


class Linear:
    """y = x W^T + b, run by whichever path is fastest for the rows at hand (`call_args`).

    On CPU in bf16 and fp32 the weight is prepacked for oneDNN, which beats F.linear there (F.linear's fp32 path is
    MKL's sgemm, slow on AMD CPUs); where oneDNN cannot pack bf16 (no AVX512-BW/VL/DQ), its fp32 GEMM runs over the
    widened weight. fp64 and fp16 keep F.linear.

    A few rows (a decode step, a short verify segment) are memory-bound: every weight is read once for a handful of
    FMAs. There engine/csrc's `linear_small` streams the plain weight at close to the machine's read bandwidth (it
    prefetches; oneDNN's GEMM stays further from it), so the plain weight is kept beside the packed one, at the cost
    of the weights' memory once more. With AVX512-BF16, bf16 runs `linear_bf16` from SMALL_BF16_ROWS + 1 to BF16_ROWS
    rows: vdpbf16ps multiplies and adds 32 bf16 pairs an instruction, where linear_small widens the weight and is
    limited by its fp32 FMAs.

    The kernels read each weight in the layout memory serves fastest and in the fewest bytes that hold its values
    exactly (the same result to the bit):
    - bf16 as tiles of 8 rows x 32 columns (`tile_bf16`): each group of 8 rows is one contiguous run read front to
      back, which memory serves much faster than the plain layout's interleaved per-row streams. linear_bf16 also
      requests the run two ahead into L2 (L1 requests would fill the core's few miss buffers);
    - fp32 whose every value bf16 holds exactly (a drafter trained and saved in bf16): bf16, widened on load;
    - fp32 whose values are Q8_0 values (an int8 times one fp16 scale per 32 values of a row: the default model's
      tied embedding and lm_head in its GGUF, and so the default drafter's draft-vocabulary lm_head): those int8s and
      scales, about a quarter of the bytes.
    The row limits below are where each path stopped winning on the CPUs we measured; see docs/benchmarks.md.

    `invariant=True` (the engine's deterministic mode) runs every row count through one kernel whose arithmetic for
    an output does not depend on the number of rows, so a row's result no longer depends on the batch it came in:
    - a bf16 weight with AVX512-BF16: `linear_bf16` over its tiles at every row count. Each output is one chain of
      vdpbf16ps over k, its 16 lanes then summed in a fixed order, whatever the rows' blocking; it multiplies twice
      the pairs an instruction of the FMA chains below, which bind at a verify's or a batch's rows;
    - otherwise `linear_panels`, which gives every output one FMA chain over k in order. Its weight is held in panels
      of 16 outputs ([N / 16, K, 16], `panels`), in the fewest bytes that hold its values exactly (bf16 or Q8_0, as
      above; the same bits from any of them); a Q8_0 weight also keeps fp32 panels for more than PANEL_COMPACT_ROWS
      rows, where widening int8 costs more than the bytes it saves.
    No oneDNN or linear_small copy is kept."""

    PACKED_DTYPES = (torch.bfloat16, torch.float32)
    SMALL_ROWS = 8  # the kernel's limit; it beats oneDNN up to there in fp32, bf16 and Q8_0
    SMALL_BF16_ROWS = 2  # linear_small up to here in bf16 too: ahead of linear_bf16 at 1-2 rows, behind from 3
    BF16_ROWS = 32  # linear_bf16 up to here: ahead of oneDNN's bf16 GEMM below 32 rows, level at 32-48
    PANEL_COMPACT_ROWS = 16  # invariant: Q8_0 panels up to here, fp32 panels above

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, invariant: bool = False):
        self.weight = weight
        self.bias = bias
        self.out_features, self.in_features = weight.shape
        self.invariant = invariant
        self._panels = None  # invariant: (compact panels, their Q8_0 scales or None, fp32 panels or None, padded bias)
        self._packed = None
        self._small = None
        self._small_weight = weight
        self._q8 = None
        self._bf16 = None
        self._widened, self._bias32 = False, None  # bf16 through oneDNN's fp32 GEMM over the widened weight
        if invariant:
            if not invariant_possible(weight):
                raise ValueError("a batch-invariant linear needs the engine's CPU kernels (engine/csrc: a CPU with "
                                 "AVX2 + FMA or AVX-512, float32 or bfloat16, in_features a multiple of 32)")
            self._kernels, self.weight, self._small_weight = cpu_kernels(), None, None
            if weight.dtype == torch.bfloat16 and self._kernels.has_linear_bf16():
                self._bf16, self._small_weight = self._kernels, tile_bf16(weight)  # linear_bf16's tiles, as below
            else:
                self._panels = self._invariant_panels(weight, bias)
            return
        cpu = weight.device.type == "cpu" and weight.dtype in self.PACKED_DTYPES
        if cpu and torch.backends.mkldnn.is_available():
            try:
                self._packed = torch.ops.mkldnn._reorder_linear_weight(weight, 64)
            except RuntimeError:  # oneDNN's bf16 path needs AVX512-BW/VL/DQ or AVX-NE-CONVERT (not on AVX2-only CPUs)
                if weight.dtype == torch.bfloat16:
                    # There F.linear's bf16 GEMM is several times slower than fp32 oneDNN. The widened weight holds
                    # the same values and a bf16 GEMM accumulates in fp32 too; the output is rounded to bf16 once, as
                    # there. The fp32 copy costs twice the weight's memory.
                    self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.float(), 64)
                    self._widened, self._bias32 = True, None if bias is None else bias.float()
        k = cpu_kernels() if cpu and weight.shape[1] % 16 == 0 else None
        if k is not None and weight.dtype == torch.bfloat16 and weight.shape[1] % 32 == 0 and k.has_linear_bf16():
            self._bf16 = k
        if k is not None and k.has_linear_small():
            self._small = k
            if weight.dtype == torch.float32:
                held = weight.to(torch.bfloat16)
                if torch.equal(held.float(), weight):
                    self._small_weight = held
                elif (q8 := q8_exact(weight)) is not None:
                    self._q8, self._small_weight = q8, None
        if self._small is not None and self._small_weight is not None and self._small_weight.dtype == torch.bfloat16:
            self._small_weight = tile_bf16(self._small_weight)
        if self._packed is not None and (self._small is None or self._small_weight is not weight):
            self.weight = None  # the packed copy is all that runs beside the kernel's; dropping the plain one saves RSS

    def _invariant_panels(self, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
        """(compact panels, Q8_0 scales or None, fp32 panels or None, bias padded to the panels' outputs)."""
        pad = -weight.shape[0] % 16
        bias = None if bias is None else F.pad(bias, (0, pad))
        if weight.dtype == torch.float32:
            held = weight.to(torch.bfloat16)
            if torch.equal(held.float(), weight):
                return panels(held), None, None, bias
            if (q8 := q8_exact(weight)) is not None:
                return panels(q8[0]), panels(q8[1]), panels(weight), bias
        return panels(weight), None, None, bias

    def call_args(self, rows: int | None, dtype: torch.dtype) -> tuple | None:
        """(kind, weight, q8 scales, bias) of what runs x of `dtype`, `rows` contiguous rows (None: x is not that),
        kind one of the LINEAR_* below (engine/csrc's LinearKernel); None where F.linear does."""
        if self.invariant and self._bf16 is not None:  # x is bf16 as the weight: F.linear takes no mixed dtypes
            return LINEAR_BF16, self._small_weight, None, self.bias
        if self._panels is not None:
            compact, scales, fp32, bias = self._panels
            if fp32 is not None and (rows is None or rows > self.PANEL_COMPACT_ROWS):
                return LINEAR_PANELS, fp32, None, bias
            return LINEAR_PANELS, compact, scales, bias
        if rows is not None:  # the kernels take contiguous rows only
            if self._bf16 is not None and dtype == torch.bfloat16 and self.SMALL_BF16_ROWS < rows <= self.BF16_ROWS:
                return LINEAR_BF16, self._small_weight, None, self.bias
            if self._small is not None and rows <= self.SMALL_ROWS:
                if self._q8 is not None:
                    return LINEAR_SMALL_Q8, *self._q8, self.bias
                return LINEAR_SMALL, self._small_weight, None, self.bias
        if self._widened:
            return LINEAR_ONEDNN_WIDENED, self._packed, None, self._bias32
        if self._packed is not None:
            return LINEAR_ONEDNN, self._packed, None, self.bias
        return None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.invariant and (x.dim() != 2 or not x.is_contiguous()):
            return self(x.reshape(-1, x.shape[-1]).contiguous()).view(*x.shape[:-1], -1)
        args = self.call_args(x.shape[0] if x.dim() == 2 and x.is_contiguous() else None, x.dtype)
        if args is None:
            return F.linear(x, self.weight, self.bias)
        kind, w, q8_scales, bias = args
        if kind == LINEAR_PANELS:
            y = self._kernels.linear_panels(x, w, q8_scales, bias)
            return y if y.shape[1] == self.out_features else y[:, :self.out_features].contiguous()
        if kind == LINEAR_BF16:
            return self._bf16.linear_bf16(x, w, bias)
        if kind == LINEAR_SMALL_Q8:
            return self._small.linear_small_q8(x, w, q8_scales, bias)
        if kind == LINEAR_SMALL:
            return self._small.linear_small(x, w, bias)
        if kind == LINEAR_ONEDNN_WIDENED:
            return torch.ops.mkldnn._linear_pointwise(x.float(), w, bias, "none", [], "").to(x.dtype)
        return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")


def layer_call_args(layers, rows: int, dtype: torch.dtype) -> tuple[list, list[int]] | None:
    """Every layer's parameters and what runs its linears, for the one-call layer loop (decoder_layers in engine/csrc)
    at `rows` tokens. `layers`: (input_norm, qkv, q_norm, k_norm, o, post_norm, gate_up, down) per layer, norms as
    weights (q/k norms may be None), linears as Linear. None where a linear would run F.linear."""
    params, kinds = [], []
    for input_norm, qkv, q_norm, k_norm, o, post_norm, gate_up, down in layers:
        linears = [lin.call_args(rows, dtype) for lin in (qkv, o, gate_up, down)]
        if any(a is None for a in linears) or any(lin.invariant and lin.out_features % 16
                                                  for lin in (qkv, o, gate_up, down)):
            return None  # F.linear, or panels whose padded outputs the Python loop drops
        kinds += [a[0] for a in linears]
        params += [input_norm, *linears[0][1:], q_norm, k_norm, *linears[1][1:], post_norm, *linears[2][1:],
                   *linears[3][1:]]
    return params, kinds


def invariant_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
    """A Linear over `weight`, batch-invariant where the kernels take it (the CPU kernels, float32 or bfloat16,
    in_features a multiple of 32), since that kernel is also the faster one; a default Linear elsewhere."""
    return Linear(weight, bias, invariant=invariant_possible(weight))


def invariant_possible(weight: torch.Tensor) -> bool:
    """Whether Linear(weight, invariant=True) can run: the CPU kernels, float32 or bfloat16, in_features % 32 == 0."""
    k = cpu_kernels() if weight.device.type == "cpu" else None
    return (k is not None and k.has_linear_small() and weight.dtype in (torch.float32, torch.bfloat16)
            and weight.shape[1] % 32 == 0)


def invariance_unavailable(ops: Ops, dtype: torch.dtype, in_features: tuple[int, ...]) -> str | None:
    """Why the batch-invariant kernels cannot run a model (None where they can): they are the CPU kernels' (Linear's
    `invariant`, the paged attention kernel), in float32 or bfloat16, over widths that are multiples of 32."""
    if not ops.fused or not ops.k.has_linear_small():
        return (f"they are off or not built here (DSPARK_KERNELS={os.environ.get('DSPARK_KERNELS', 'auto')}, "
                "a GPU, or a CPU without AVX2 + FMA)")
    if ops.attention != "kernel":
        return f"the paged attention is {ops.attention}, not the kernel (DSPARK_ATTENTION)"
    if dtype not in (torch.float32, torch.bfloat16):
        return f"they run float32 and bfloat16, not {dtype}"
    if any(k % 32 for k in in_features):
        return f"the model's layer widths {in_features} are not all multiples of 32"
    return None


def panels(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] as engine/csrc's linear_panels reads it, [ceil(N / 16), K, 16]: 16 outputs' weights side by side at each
    k, the last panel's missing outputs zero."""
    N, K = weight.shape
    return F.pad(weight, (0, 0, 0, -N % 16)).view(-1, 16, K).transpose(1, 2).contiguous()


def tile_bf16(weight: torch.Tensor) -> torch.Tensor:
    """A bf16 weight [N, K] as the kernels' tiles [N / 8, K / 32, 8, 32] where its shape allows, else as it is: each
    group of 8 rows becomes one contiguous run that the kernels read front to back (engine/csrc, TiledBF16)."""
    N, K = weight.shape
    if N % 8 or K % 32:
        return weight
    return weight.view(N // 8, 8, K // 32, 32).permute(0, 2, 1, 3).contiguous()


def q8_exact(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(q int8 [N, K], d float32 [N, K / 32]) with d * q == weight exactly, d an fp16 value per 32 values of a row
    (GGUF's Q8_0), or None where the weight is not such values. Q8_0 stores d = amax / 127 and the largest value of
    a block quantizes to +-127, so amax(block) / 127 recovers d; every block is then checked."""
    N, K = weight.shape
    if weight.dtype != torch.float32 or K % 32:
        return None
    for rows in (weight[:1], weight):  # the first row rejects most weights cheaply
        blocks = rows.reshape(-1, K // 32, 32)
        d = blocks.abs().amax(-1) / 127
        if not torch.equal(d.half().float(), d):
            return None
        q = torch.round(blocks / torch.where(d == 0, 1.0, d)[..., None])
        if q.abs().max() > 127 or not torch.equal(q * d[..., None], blocks):
            return None
    return q.to(torch.int8).reshape(N, K).contiguous(), d.contiguous()


@dataclass
class Layer:
    input_norm: torch.Tensor
    qkv: Linear
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear
    down: Linear


class DecoderLM:
    """Holds the target's weights on `device` in `dtype` and runs packed forwards over a paged KV cache.

    Deterministic (batch-invariant): a token's logits are the same bits whatever else the step holds (other
    sequences, its own verify segment or prefill chunk). Every linear runs one kernel whatever the row count
    (Linear's `invariant`), and every query, prefill chunks included, goes to the attention kernel, whose rows each
    reduce in an order fixed by position (`small_query`). It needs the CPU kernels (engine/csrc);
    `deterministic=None` turns it on wherever they run, True insists (an error elsewhere), False turns it off."""

    def __init__(self, hf_model, device: torch.device, dtype: torch.dtype, max_positions: int, block_size: int = 16,
                 deterministic: bool | None = None):
        cfg = hf_model.config
        self.config = cfg
        self.device, self.dtype = device, dtype
        self.num_layers = cfg.num_hidden_layers
        self.hidden_size = cfg.hidden_size
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.vocab_size = cfg.vocab_size
        self.ops = Ops(device, block_size, self.head_dim)
        self.eps = cfg.rms_norm_eps
        widths = (cfg.hidden_size, self.num_heads * self.head_dim, cfg.intermediate_size)
        why_not = invariance_unavailable(self.ops, dtype, widths)
        if deterministic and why_not:
            raise ValueError(f"deterministic=True needs the engine's CPU kernels: {why_not}, so the step would run "
                             "library kernels whose results depend on the batch")
        deterministic = not why_not if deterministic is None else deterministic
        self.deterministic = deterministic
        # Queries of at most this many tokens a sequence go to the attention kernel; longer prefill chunks to SDPA.
        self.small_query = sys.maxsize if deterministic else SMALL_QUERY

        def w(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.detach().to(device=device, dtype=dtype).contiguous()

        base = hf_model.model
        self.embed_tokens = w(base.embed_tokens.weight)
        self.layers: list[Layer] = []
        for layer in base.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv_bias = None
            if attn.q_proj.bias is not None:
                qkv_bias = w(torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
            self.layers.append(Layer(
                input_norm=w(layer.input_layernorm.weight),
                qkv=Linear(w(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])), qkv_bias,
                           invariant=deterministic),
                q_norm=w(attn.q_norm.weight) if hasattr(attn, "q_norm") else None,
                k_norm=w(attn.k_norm.weight) if hasattr(attn, "k_norm") else None,
                o=Linear(w(attn.o_proj.weight), w(attn.o_proj.bias), invariant=deterministic),
                post_norm=w(layer.post_attention_layernorm.weight),
                gate_up=Linear(w(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])), invariant=deterministic),
                down=Linear(w(mlp.down_proj.weight), invariant=deterministic),
            ))
        self.scaling = base.layers[0].self_attn.scaling
        self.final_norm = w(base.norm.weight)
        lm_head = hf_model.get_output_embeddings().weight
        self.lm_head_weight = self.embed_tokens if lm_head is base.embed_tokens.weight else w(lm_head)
        self.lm_head = Linear(self.lm_head_weight, invariant=deterministic)
        # RoPE tables from the model's own rotary module, so every rope_type it supports is honoured.
        with torch.no_grad():
            pos = torch.arange(max_positions)[None]
            cos, sin = base.rotary_emb(torch.zeros(1, dtype=dtype), pos)
        self.cos, self.sin = cos[0].to(device), sin[0].to(device)
        self._layer_args: dict[int, tuple[list, list[int]] | None] = {}

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVCache,
        tap_layers: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids, positions: [T] for all sequences packed. Returns the last hidden state [T, d] (before the final
        norm) and the tapped decoder-layer outputs concatenated [T, len(tap_layers) * d] (or None)."""
        ops, eps = self.ops, self.eps
        cos = self.cos.index_select(0, positions)
        sin = self.sin.index_select(0, positions)
        h = F.embedding(input_ids, self.embed_tokens)
        taps = h.new_empty(h.shape[0], len(tap_layers) * self.hidden_size) if tap_layers else None
        g = meta.small
        if not meta.prefills and g is not None and g.cu_q is not None:
            if (args := self._layer_call_args(h.shape[0])) is not None:  # the whole loop below in one C++ call
                ops.k.decoder_layers(h, cos, sin, meta.slot_mapping, g.cu_q, g.ctx_len, g.block_tables, *args,
                                     kv_cache.k, kv_cache.v, self.num_heads, self.num_kv_heads, eps, self.scaling,
                                     meta.causal, list(tap_layers), taps)
                return h, taps
        x = ops.rms_norm(h, self.layers[0].input_norm, eps)
        for i, layer in enumerate(self.layers):
            q = ops.rope_and_cache(layer.qkv(x), cos, sin, meta.slot_mapping, kv_cache.k[i], kv_cache.v[i],
                                   self.num_heads, self.num_kv_heads, layer.q_norm, layer.k_norm, eps)
            o = paged_attention(q, kv_cache.k[i], kv_cache.v[i], meta, self.scaling, ops.k)
            x = ops.add_rms_norm(layer.o(o), h, layer.post_norm, eps)  # h += attention output
            mlp_out = layer.down(ops.silu_mul(layer.gate_up(x)))
            if i + 1 < self.num_layers:
                x = ops.add_rms_norm(mlp_out, h, self.layers[i + 1].input_norm, eps)  # h += MLP output
            else:
                h.add_(mlp_out)
            if i in tap_layers:  # copied now: h is updated in place by the next layer
                k = tap_layers.index(i)
                taps[:, k * self.hidden_size: (k + 1) * self.hidden_size] = h
        return h, taps

    def _layer_call_args(self, rows: int) -> tuple[list, list[int]] | None:
        """decoder_layers' arguments for this model's layers at `rows` tokens (layer_call_args), cached per row
        count."""
        if rows not in self._layer_args:
            self._layer_args[rows] = layer_call_args(
                [(ly.input_norm, ly.qkv, ly.q_norm, ly.k_norm, ly.o, ly.post_norm, ly.gate_up, ly.down)
                 for ly in self.layers],
                rows, self.dtype)
        return self._layer_args[rows]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits in the model dtype (greedy argmax needs no float copy; sampling converts)."""
        return self.lm_head(self.ops.rms_norm(hidden, self.final_norm, self.eps))
