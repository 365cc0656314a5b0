"""DSpark drafter: parallel Qwen3-style backbone + Markov sequential head + confidence head.

Module and parameter names mirror DeepSpec's Qwen3DSparkModel so that
`state_dict()` keys are exactly the checkpoint tensor names
(fc, hidden_norm, layers.N.self_attn.*, layers.N.mlp.*, norm, markov_head.*,
confidence_head.proj, embed_tokens, lm_head).

The model itself is stateless: per-sequence context K/V lives in
`context.DraftContextPool`, which writes what `context_kv_rows` projects on append and
calls `block_hidden_paged` + `decode` on propose. Training runs the same computation on
gathered tensors (train.forward_blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import paged_attention
from engine.model import invariant_linear, layer_call_args
from engine.ops import Ops, lowrank_chunks
from engine.penalties import DraftPenalties, apply_penalties

from . import checkpoint
from .config import DSparkConfig


@dataclass
class DraftProposal:
    tokens: torch.Tensor  # [B, gamma] int64 target-vocab ids
    probs: torch.Tensor | None  # [B, gamma, V] p_d, the Markov-corrected distributions sampled from (see below)
    token_probs: torch.Tensor | None  # [B, gamma] p_d(chosen token)
    confidence: torch.Tensor | None  # [B, gamma] c_k in (0,1); None without a confidence head
    # probs="full": V is the target vocabulary. probs="compact": V is the draft vocabulary and draft_vocab maps
    # its indices to target ids (None when the two are the same). probs="none": no distributions.
    draft_vocab: torch.Tensor | None = None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    fast_ops = None  # engine.ops.Ops, set by DSparkDrafter.optimize_for_inference (same rounding as below)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fast_ops is not None and not torch.is_grad_enabled():
            return self.fast_ops.rms_norm(x.contiguous(), self.weight, self.eps)
        # Same op order as HF Qwen3RMSNorm: normalise in >= fp32, cast back, then scale.
        dtype = x.dtype
        x = x.to(torch.promote_types(dtype, torch.float32))
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    # HF "default" rope, computed in fp32 exactly as transformers does.
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., n, heads, hd]; cos/sin [..., n, hd/2] (half tables, rotate-half convention)."""
    cos = cos.to(x.dtype).unsqueeze(-2)
    sin = sin.to(x.dtype).unsqueeze(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def sigmoid_by_element(x: torch.Tensor) -> torch.Tensor:
    """torch.sigmoid whose result for an element does not depend on where it sits: ATen's CPU loop runs all but the
    last few elements (fewer than two vectors) through a vectorized sigmoid and those through a scalar one, which
    rounds differently, so a confidence would change with the batch it came in. Padded to a multiple of 64, every
    element takes the vectorized path."""
    flat = x.reshape(-1)
    n = flat.numel()
    return torch.sigmoid(F.pad(flat, (0, -n % 64)))[:n].view_as(x)


class PackedLinear(nn.Module):
    """An inference-only nn.Linear whose matmul runs through the engine's Linear (oneDNN-prepacked on a bf16 CPU).
    The parameters stay registered under the same names, so checkpoints and state_dict() are unchanged."""

    def __init__(self, lin: nn.Linear):
        super().__init__()
        self.weight, self.bias = lin.weight, lin.bias
        self.fast = invariant_linear(lin.weight.detach(), None if lin.bias is None else lin.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fast(x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], -1)


class Attention(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        d, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(d, self.n_heads * self.hd, bias=bias)
        self.k_proj = nn.Linear(d, self.n_kv * self.hd, bias=bias)
        self.v_proj = nn.Linear(d, self.n_kv * self.hd, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.hd, d, bias=bias)
        self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
        self.qkv = None  # engine.model.Linear over [q; k; v], set by DSparkDrafter.optimize_for_inference

    def kv(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """K (k_norm + rope) and V for tokens x [..., n, d] -> [..., n, n_kv, hd] (training)."""
        k = apply_rope(self.k_norm(self.k_proj(x).unflatten(-1, (self.n_kv, self.hd))), cos, sin)
        return k, self.v_proj(x).unflatten(-1, (self.n_kv, self.hd))


class MLP(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)
        self.gate_up = None  # (engine.model.Linear over [gate; up], engine.ops.Ops), set by optimize_for_inference

    def forward(self, x):
        if self.gate_up is not None and not torch.is_grad_enabled():
            lin, ops = self.gate_up
            return self.down_proj(ops.silu_mul(lin(x.reshape(-1, x.shape[-1]))).view(*x.shape[:-1], -1))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)


class MarkovHead(nn.Module):
    """Transition bias B_k added to the base logits U_k (DeepSpec markov_head.py).

    vanilla: B = W2(W1[x_{k-1}])
    gated:   B = W2(sigmoid(gate_proj([h_k; W1[x_{k-1}]])) * W1[x_{k-1}])
    rnn:     s_k = g*s_{k-1} + (1-g)*tanh(c), B = W2(tanh(o)),
             [g;c;o] = joint_proj([s_{k-1}; W1[x_{k-1}]; h_k]), s_0 = 0
    W1 is indexed by target-vocab ids (x_0 is the anchor); W2 rows are the draft vocabulary.
    """

    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        r, d = cfg.markov_rank, cfg.hidden_size
        self.kind = cfg.markov_head_type
        self.markov_w1 = nn.Embedding(cfg.vocab_size, r)
        self.markov_w2 = nn.Linear(r, cfg.out_vocab_size, bias=False)
        if self.kind == "gated":
            self.gate_proj = nn.Linear(d + r, r)
        elif self.kind == "rnn":
            self.joint_proj = nn.Linear(2 * r + d, 3 * r)

    def step(self, prev_ids, h, state):
        """prev_ids [B], h [B,d] -> (bias [B, out_vocab], new rnn state or None)."""
        e = self.markov_w1(prev_ids)
        if self.kind == "gated":
            e = torch.sigmoid(self.gate_proj(torch.cat((h, e), -1))) * e
        elif self.kind == "rnn":
            if state is None:
                state = torch.zeros_like(e)
            g, c, o = self.joint_proj(torch.cat((state, e, h), -1)).chunk(3, -1)
            g = torch.sigmoid(g)
            state = g * state + (1.0 - g) * torch.tanh(c)
            e = torch.tanh(o)
        return self.markov_w2(e), state


class ConfidenceHead(nn.Module):
    """c_k = sigmoid(proj([h_k ; W1[x_{k-1}]])) (or proj(h_k) without the Markov feature)."""

    def __init__(self, in_dim: int):
        super().__init__()
        self.proj = nn.Linear(in_dim, 1)

    def forward(self, feats):
        return self.proj(feats).squeeze(-1)


class DSparkDrafter(nn.Module):
    def __init__(self, config: DSparkConfig, draft_vocab: torch.Tensor | None = None):
        super().__init__()
        cfg = self.config = config
        d = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, d)
        self.fc = nn.Linear(cfg.num_taps * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(d, cfg.out_vocab_size, bias=False)
        self.markov_head = MarkovHead(cfg) if cfg.markov_rank > 0 else None
        self.confidence_head = None
        if cfg.enable_confidence_head:
            self.confidence_head = ConfidenceHead(d + (cfg.markov_rank if cfg.confidence_head_with_markov else 0))
        # Optional truncated draft vocabulary: draft index -> target id.
        if cfg.draft_vocab_size:
            if draft_vocab is None:
                draft_vocab = torch.arange(cfg.draft_vocab_size)
            assert draft_vocab.shape == (cfg.draft_vocab_size,)
            self.register_buffer("draft_vocab", draft_vocab.long())
        else:
            self.draft_vocab = None
        self._rope: dict = {}  # device -> (cos, sin) half tables, built lazily in fp32
        self._rope_full: dict = {}  # (device, dtype) -> full-width tables in the model dtype, for the paged path
        # Sequential Temperature Scaling of the confidence logits, one temperature per block position
        # (draft_service/calibrate.py); None = uncalibrated.
        self.conf_temperatures: torch.Tensor | None = None
        self._argmax = None  # a faster row argmax, set by optimize_for_inference
        # (CPU kernels, W2^T packed by lowrank_chunks) for the Markov bias at every batch size (add_lowrank_ per
        # position, or the whole greedy loop in one markov_greedy call), set by optimize_for_inference
        self._lowrank = None
        self._draft_columns = None  # (draft_vocab's identity, target id -> draft index or -1), for penalties
        self._ctx_kv = None  # engine.model.Linear over every layer's [k_proj; v_proj], set by optimize_for_inference
        self._confidence = None  # (w_h, per-token W1 term, bias) of the folded confidence head, likewise
        # rows -> decoder_layers' arguments (engine.model.layer_call_args), or None where a linear runs F.linear; None
        # until optimize_for_inference
        self._layer_args: dict | None = None

    # -- init / misc -----------------------------------------------------------
    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> "DSparkDrafter":
        """DeepSpec/HF init: Linear & Embedding ~ N(0, initializer_range), biases 0, norms 1.
        (DeepSpec does not zero-init markov_w2.)"""
        std = self.config.initializer_range
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                m.weight.normal_(0.0, std, generator=generator)
                if getattr(m, "bias", None) is not None:
                    m.bias.zero_()
            elif isinstance(m, RMSNorm):
                m.weight.fill_(1.0)
        return self

    @torch.no_grad()
    def optimize_for_inference(self) -> "DSparkDrafter":
        """Frozen serving: prepacked linears, q/k/v, gate/up and the context K/V projections fused as the target's
        forward fuses them, the engine's fused RMSNorm/argmax/silu where the device has them, and the confidence
        head folded (below). The parameters stay registered under their checkpoint names."""
        ops = Ops(self.device)
        self._argmax = ops.argmax if ops.fused else None
        mh = self.markov_head
        if ops.fused and mh is not None and mh.kind == "vanilla":
            # Markov bias through the fused low-rank kernels: W2^T packed in chunks, once.
            self._lowrank = (ops.k, lowrank_chunks(mh.markov_w2.weight.detach().t()))

        def fused(*lins: nn.Linear) -> Linear:
            bias = None if lins[0].bias is None else torch.cat([lin.bias for lin in lins])
            return invariant_linear(torch.cat([lin.weight for lin in lins]).contiguous(), bias)

        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            attn.qkv = fused(attn.q_proj, attn.k_proj, attn.v_proj)
            mlp.gate_up = (fused(mlp.gate_proj, mlp.up_proj), ops)
        self._ctx_kv = fused(*[p for layer in self.layers for p in (layer.self_attn.k_proj, layer.self_attn.v_proj)])
        ch = self.confidence_head
        if ch is not None and mh is not None and self.config.confidence_head_with_markov:
            # w . [h ; W1[x]] + b = w_h . h + (W1 w_e)[x] + b: the Markov half becomes one number per token.
            w = ch.proj.weight[0].to(self.prob_dtype)
            d = self.config.hidden_size
            # w_h . h as a [1, d] linear: batch-invariant where the kernels run (a matmul's order may follow B).
            self._confidence = (invariant_linear(w[:d][None].contiguous()),
                                mh.markov_w1.weight.to(self.prob_dtype) @ w[d:], ch.proj.bias.to(self.prob_dtype))
        packed_by_fusion = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
        for name, mod in list(self.named_modules()):
            leaf = name.rsplit(".", 1)[-1]
            if isinstance(mod, nn.Linear) and name != "embed_tokens" and leaf not in packed_by_fusion:
                parent = self.get_submodule(name.rsplit(".", 1)[0]) if "." in name else self
                setattr(parent, leaf, PackedLinear(mod))
            elif isinstance(mod, RMSNorm) and ops.fused:
                mod.fast_ops = ops
        if ops.fused:
            self._layer_args = {}
        return self

    def _layer_call_args(self, rows: int) -> tuple[list, list[int]] | None:
        """decoder_layers' arguments for the draft layers at `rows` block tokens, cached per row count."""
        if rows not in self._layer_args:
            self._layer_args[rows] = layer_call_args(
                [(ly.input_layernorm.weight.detach(), ly.self_attn.qkv, ly.self_attn.q_norm.weight.detach(),
                  ly.self_attn.k_norm.weight.detach(), ly.self_attn.o_proj.fast,
                  ly.post_attention_layernorm.weight.detach(), ly.mlp.gate_up[0], ly.mlp.down_proj.fast)
                 for ly in self.layers], rows, self.dtype)
        return self._layer_args[rows]

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def gamma(self) -> int:
        return self.config.block_size

    @property
    def prob_dtype(self) -> torch.dtype:
        # p_d in at least fp32 (fp64 when the model runs in fp64).
        return torch.promote_types(self.dtype, torch.float32)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Half-width cos/sin [..., hd/2] for absolute positions, from a precomputed fp32 table."""
        tab = self._rope.get(positions.device)
        if tab is None:
            inv = rope_inv_freq(self.config.head_dim, self.config.rope_theta).to(positions.device)
            pos = torch.arange(self.config.max_position_embeddings, device=positions.device, dtype=torch.float)
            freqs = pos[:, None] * inv[None, :]
            tab = self._rope[positions.device] = (freqs.cos(), freqs.sin())
        return tab[0][positions], tab[1][positions]

    def rope_full(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Full-width cos/sin [n, hd] in the model dtype (the engine's rope_and_cache layout), for positions [n]."""
        key = (positions.device, self.dtype)
        tab = self._rope_full.get(key)
        if tab is None:
            c, s = self.rope(torch.arange(self.config.max_position_embeddings, device=positions.device))
            tab = self._rope_full[key] = (torch.cat((c, c), -1).to(self.dtype), torch.cat((s, s), -1).to(self.dtype))
        return tab[0].index_select(0, positions), tab[1].index_select(0, positions)

    # -- context ---------------------------------------------------------------
    @torch.no_grad()
    def context_kv_rows(self, taps: torch.Tensor) -> torch.Tensor:
        """Raw target taps [n, n_taps*d] -> every layer's [k_proj ; v_proj] of the context feature
        hidden_norm(fc(taps)): [n, L, 2*n_kv*hd], before k_norm and rope (the pool applies those as it writes)."""
        ctx = self.hidden_norm(self.fc(taps.to(self.dtype)))
        if self._ctx_kv is not None:  # every layer's k_proj and v_proj in one matmul
            return self._ctx_kv(ctx).view(ctx.shape[0], len(self.layers), -1)
        return torch.stack([torch.cat((layer.self_attn.k_proj(ctx), layer.self_attn.v_proj(ctx)), -1)
                            for layer in self.layers], dim=1)

    @torch.no_grad()
    def block_input_ids(self, anchor_ids: torch.Tensor, hints: torch.Tensor | None = None) -> torch.Tensor:
        """The block's input tokens [B, G]: the anchor, then the mask token, or with copy hints (config
        copy_hint_ngram) at position k >= 1 the lookup's proposal for the token at anchor + k where it has one.
        hints [B, >= G - 1]: proposals for anchor + 1 .., -1 where none."""
        B, G = anchor_ids.shape[0], self.gamma
        ids = torch.full((B, G), self.config.mask_token_id, dtype=torch.long, device=anchor_ids.device)
        ids[:, 0] = anchor_ids
        if hints is not None and self.config.copy_hint_ngram is not None and G > 1:
            h = hints[:, : G - 1].to(ids.device)
            ids[:, 1:] = torch.where(h >= 0, h, ids[:, 1:])
        return ids

    @torch.no_grad()
    def block_hidden_paged(self, anchor_ids, anchor_pos, meta, cache, ops, hints=None) -> torch.Tensor:
        """block_hidden, reading each sequence's context in place from the pool's paged caches (engine.attention
        layouts): every layer writes the block's K/V into slots just after its sequence's context (lent by the pool
        for this call, beyond the context's length, so they never become context) and attends with causal=False
        metadata. anchor_ids/anchor_pos [B]; hints: see block_input_ids; returns h [B, gamma, d]."""
        B, G = anchor_ids.shape[0], self.gamma
        x = self.embed_tokens(self.block_input_ids(anchor_ids, hints)).view(B * G, -1)
        cos, sin = self.rope_full((anchor_pos[:, None] + torch.arange(G, device=anchor_pos.device)).view(-1))
        g = meta.small
        if (self._layer_args is not None and g is not None and g.cu_q is not None
                and (args := self._layer_call_args(B * G)) is not None):
            # The loop below in one C++ call, as the target's decode step runs its layers (engine.model.DecoderLM)
            attn = self.layers[0].self_attn
            ops.k.decoder_layers(x, cos, sin, meta.slot_mapping, g.cu_q, g.ctx_len, g.block_tables, *args,
                                 cache.k, cache.v, attn.n_heads, attn.n_kv, self.config.rms_norm_eps, attn.hd ** -0.5,
                                 False, [], None)
            return self.norm(x).view(B, G, -1)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            if attn.qkv is not None:
                qkv = attn.qkv(h)
            else:
                qkv = torch.cat((attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)), -1)
            q = ops.rope_and_cache(qkv, cos, sin, meta.slot_mapping, cache.k[i], cache.v[i], attn.n_heads, attn.n_kv,
                                   attn.q_norm.weight, attn.k_norm.weight, attn.k_norm.eps)
            x = x + attn.o_proj(paged_attention(q, cache.k[i], cache.v[i], meta, attn.hd ** -0.5, ops.k))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x).view(B, G, -1)

    @torch.no_grad()
    def _penalise(self, rows: torch.Tensor, p: DraftPenalties) -> None:
        """Apply `p` in place to `rows` [G, V_draft], as the engine applies it to the target's rows (a token outside
        the draft vocabulary is never drafted, so its penalty does not matter)."""
        if self.draft_vocab is None:
            apply_penalties(rows, p, p.prompt, p.output)
            return
        key = (self.draft_vocab.data_ptr(), self.draft_vocab._version)  # rebuilt when the buffer is loaded anew
        if self._draft_columns is None or self._draft_columns[0] != key:
            columns = torch.full((self.config.vocab_size,), -1, dtype=torch.long)
            columns[self.draft_vocab.cpu()] = torch.arange(len(self.draft_vocab))
            self._draft_columns = (key, columns)
        apply_penalties(rows, p, p.prompt, p.output, columns=self._draft_columns[1])

    def decode(self, h, anchor_ids, temperature=None, uniforms=None, probs_format: str = "full",
               penalties: list[DraftPenalties | None] | None = None) -> DraftProposal:
        """Left-to-right Markov decoding over the block hidden states h [B,G,d].

        temperature [B] (0 = greedy) and uniforms [B,G] in [0,1) drive sampling; both None = all greedy.
        p_d[k] = softmax((U_k + B_k) / T) for sampled rows and softmax(U_k + B_k) for greedy rows,
        where greedy rows take argmax (so argmax p_d == draft token).
        penalties [B] (or None): a row's request penalties, applied to its U (engine/penalties.py).
        """
        B, G, _ = h.shape
        pdt = self.prob_dtype
        # Base logits U for all positions in one lm_head pass, laid out [G, B, V] so that each position's rows are
        # contiguous for the loop below (which adds B_k in place and takes the row argmax).
        by_pos = self.lm_head(h.transpose(0, 1)).to(pdt)
        for b, p in enumerate(penalties or ()):
            if p is not None:
                self._penalise(by_pos[:, b], p)
        logits = by_pos.transpose(0, 1)  # [B, G, V] view
        V = logits.shape[-1]
        sampling = temperature is not None and uniforms is not None
        if sampling:
            greedy = temperature <= 1e-5
            inv_t = torch.where(greedy, 1.0, 1.0 / temperature.clamp_min(1e-5)).to(pdt)[:, None]
            probs = torch.empty(B, G, V, dtype=pdt, device=h.device)
        # The low-rank kernel at every batch size, though a GEMM would be a little faster from about 16 sequences:
        # a row's Markov bias then does not depend on the batch it came in.
        lowrank = self._lowrank if pdt == torch.float32 else None
        if lowrank is not None and not sampling:
            vocab = self.draft_vocab if self.draft_vocab is not None else anchor_ids.new_empty(0)
            local, prev_all = lowrank[0].markov_greedy(by_pos, self.markov_head.markov_w1.weight, lowrank[1],
                                                       anchor_ids.contiguous(), vocab)
        else:
            local = torch.empty(B, G, dtype=torch.long, device=h.device)  # draft-vocab indices
            prev_all = torch.empty(B, G, dtype=torch.long, device=h.device)  # x_{k-1}, target ids
            prev, state = anchor_ids, None
            for k in range(G):
                lk = by_pos[k]
                if lowrank is not None:
                    lowrank[0].add_lowrank_(lk, self.markov_head.markov_w1(prev).contiguous(), lowrank[1])
                elif self.markov_head is not None:
                    bias, state = self.markov_head.step(prev, h[:, k], state)
                    lk += bias
                nxt = self._argmax(lk) if self._argmax is not None else lk.argmax(-1)
                if sampling:
                    pk = probs[:, k] = torch.softmax(lk * inv_t, -1)
                    cdf = pk.cumsum(-1)
                    u = (uniforms[:, k].to(pdt) * cdf[:, -1])[:, None]
                    drawn = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_max(V - 1)
                    nxt = torch.where(greedy, nxt, drawn)
                local[:, k] = nxt
                prev_all[:, k] = prev
                prev = nxt if self.draft_vocab is None else self.draft_vocab[nxt]
        tokens = local if self.draft_vocab is None else self.draft_vocab[local]
        token_probs = None
        if probs_format == "none":
            probs = None
        else:
            if not sampling:
                probs = torch.softmax(logits, -1)
            token_probs = probs.gather(-1, local[..., None]).squeeze(-1)
            if self.draft_vocab is not None and probs_format == "full":
                full = torch.zeros(B, G, self.config.vocab_size, dtype=pdt, device=h.device)
                probs = full.scatter_(-1, self.draft_vocab.expand(B, G, V), probs)
        conf = None
        if self.confidence_head is not None:
            if self._confidence is not None:
                w_h, by_token, b = self._confidence
                logit = w_h(h.to(pdt).reshape(B * G, -1)).view(B, G) + by_token[prev_all] + b
            else:
                feats = h
                if self.config.confidence_head_with_markov:
                    feats = torch.cat((h, self.markov_head.markov_w1(prev_all).to(h.dtype)), -1)
                logit = self.confidence_head(feats).to(pdt)
            if self.conf_temperatures is not None:
                logit = logit / self.conf_temperatures.to(device=logit.device, dtype=pdt)
            conf = sigmoid_by_element(logit)
        return DraftProposal(tokens=tokens, probs=probs, token_probs=token_probs, confidence=conf,
                             draft_vocab=self.draft_vocab if probs_format == "compact" else None)

    # -- checkpoints (see checkpoint.py) ---------------------------------------
    @classmethod
    def from_pretrained(cls, path, *, target_embed=None, target_lm_head=None, dtype=None, device=None):
        """A frozen drafter from a checkpoint dir; embed_tokens / lm_head from the target when given (see
        checkpoint.read_checkpoint)."""
        cfg, sd, temps = checkpoint.read_checkpoint(path, target_embed=target_embed, target_lm_head=target_lm_head,
                                                    dtype=dtype, device=device)
        with torch.device("meta"):
            model = cls(cfg, draft_vocab=torch.empty(cfg.draft_vocab_size, dtype=torch.long)
                        if cfg.draft_vocab_size else None)
        expected = model.state_dict()
        for k, v in sd.items():
            if k in expected and tuple(expected[k].shape) != tuple(v.shape):
                raise ValueError(f"{k}: checkpoint shape {tuple(v.shape)} != config shape {tuple(expected[k].shape)}")
        model.load_state_dict(sd, strict=True, assign=True)  # raises on missing / unexpected names
        if temps is not None:
            model.conf_temperatures = torch.tensor(temps, dtype=torch.float64, device=model.device)
        return model.requires_grad_(False).eval()

    def save_pretrained(self, path, include_embeddings: bool = False, dtype: torch.dtype | None = None) -> None:
        checkpoint.write_checkpoint(path, self.config, self.state_dict(), include_embeddings=include_embeddings,
                                    dtype=dtype)
