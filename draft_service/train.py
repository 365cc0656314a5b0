"""Distil a DSpark drafter for a target from the target's own cached answers (draft_service/data.py).

Loss (DeepSpec's): 0.1 * CE + 0.9 * L1(p_d, p_t) + BCE(c, 1 - 0.5 * ||p_d - p_t||_1), each weighted by
exp(-k / 4) over block position k. The Markov head is teacher-forced with the real tokens; the CE label is the
target's greedy token, so sampled answers add off-greedy contexts without teaching non-greedy tokens.
p_t is the target's cached top-k distribution; its tail beyond k is taken as 0.
With copy hints (TrainConfig.copy_hint_ngram) every block reads prompt lookup's proposals in place of mask tokens,
computed from the sample's own tokens exactly as the engine computes them (engine.ngram.lookup_table).
"""
from __future__ import annotations

import json
import math
import random
import time
import weakref
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from draft_service.config import DSparkConfig
from draft_service.data import Cache, Sample
from draft_service.model import DSparkDrafter, apply_rope
from engine.loader import cpu_has_bf16
from engine.ngram import lookup_table

POSITION_DECAY = 4.0  # w_k = exp(-k / 4), as DeepSpec
LOSS_WEIGHTS = {"ce": 0.1, "l1": 0.9, "conf": 1.0}


@dataclass
class TrainConfig:
    layers: int = 1
    markov_rank: int = 64
    gamma: int = 7
    draft_vocab_size: int = 16384
    anchors_per_sample: int = 48
    samples_per_step: int = 8
    steps: int = 3000
    lr: float = 6e-4
    warmup_frac: float = 0.04
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 250
    checkpoint_every: int = 250
    init_from_target_layer: int | None = -1  # copy this target layer into the draft layers (None: random)
    init_from: str | None = None  # warm start: a trained drafter folder; layers beyond its own start as identities
    mask_token_id: int | None = None
    copy_hint_ngram: list[int] | None = None  # [min_n, max_n]: blocks read prompt lookup's proposals (None: masks)
    extra: dict = field(default_factory=dict)


def mixed_precision() -> torch.autocast:
    """bf16 autocast where the CPU computes bf16 natively, fp32 elsewhere: on an AVX2-only CPU autocast emulates bf16,
    and a linear's forward and backward run many times slower under it than in fp32."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=cpu_has_bf16())


def build_drafter(target, tc: TrainConfig, tap_layers: list[int], draft_vocab: torch.Tensor) -> DSparkDrafter:
    """A fresh drafter shaped like the target, with the target's embeddings and lm_head rows (frozen)."""
    cfg = target.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    dcfg = DSparkConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=tc.layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=head_dim, rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_parameters["rope_theta"] if hasattr(cfg, "rope_parameters") else cfg.rope_theta,
        max_position_embeddings=cfg.max_position_embeddings, block_size=tc.gamma,
        target_layer_ids=list(tap_layers), num_target_layers=cfg.num_hidden_layers,
        mask_token_id=tc.mask_token_id if tc.mask_token_id is not None else 0,
        markov_rank=tc.markov_rank, markov_head_type="vanilla" if tc.markov_rank else None,
        enable_confidence_head=True, confidence_head_with_markov=tc.markov_rank > 0,
        draft_vocab_size=len(draft_vocab),
        copy_hint_ngram=list(tc.copy_hint_ngram) if tc.copy_hint_ngram else None,
        extra={"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id},
    )
    torch.manual_seed(tc.seed)
    model = DSparkDrafter(dcfg, draft_vocab=draft_vocab).init_weights()
    with torch.no_grad():
        model.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        model.lm_head.weight.copy_(target.get_output_embeddings().weight[draft_vocab])
        if tc.init_from_target_layer is not None:
            src = target.model.layers[tc.init_from_target_layer]
            for layer in model.layers:
                for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    getattr(layer.self_attn, name).weight.copy_(getattr(src.self_attn, name).weight)
                for name in ("gate_proj", "up_proj", "down_proj"):
                    getattr(layer.mlp, name).weight.copy_(getattr(src.mlp, name).weight)
                layer.input_layernorm.weight.copy_(src.input_layernorm.weight)
                layer.post_attention_layernorm.weight.copy_(src.post_attention_layernorm.weight)
            model.norm.weight.copy_(target.model.norm.weight)
    model.embed_tokens.weight.requires_grad_(False)
    model.lm_head.weight.requires_grad_(False)
    return model


@torch.no_grad()
def warm_start(model: DSparkDrafter, base: DSparkDrafter) -> DSparkDrafter:
    """Load a trained drafter into `model` (same config but more layers). The extra layers go on top with zero output
    projections, so they start as identities: the grown model computes exactly what `base` does, and training
    can only move it from there. `model` may add copy hints that `base` lacks (no weights differ; the hints then
    change what the blocks read, and training adapts to them)."""
    n = base.config.num_hidden_layers
    if n > model.config.num_hidden_layers:
        raise ValueError(f"cannot warm-start {model.config.num_hidden_layers} layers from a {n}-layer drafter")
    for key in ("target_layer_ids", "block_size", "markov_rank", "draft_vocab_size", "hidden_size", "mask_token_id"):
        if getattr(base.config, key) != getattr(model.config, key):
            raise ValueError(f"warm start: {key} differs ({getattr(base.config, key)} vs {getattr(model.config, key)})")
    state = {k: v for k, v in base.state_dict().items() if k not in ("embed_tokens.weight", "lm_head.weight")}
    model.load_state_dict(state, strict=False)  # copies cast to the model's dtype
    for layer in model.layers[n:]:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    return model


def choose_draft_vocab(cache: Cache, size: int, always: list[int]) -> tuple[torch.Tensor, float]:
    """The `size` most frequent target tokens in the cached answers (plus `always`); returns it and its coverage."""
    counts = np.zeros(int(cache.arrays["topk_ids"].max()) + 1 if len(cache.samples) else 1, np.int64)
    total = 0
    for s in cache.samples:
        labels = cache.targets(s)[0][:, 0]  # greedy targets
        np.add.at(counts, labels, 1)
        total += len(labels)
    order = [t for t in np.argsort(-counts, kind="stable").tolist() if t not in always]
    vocab = sorted(set(always) | set(order[: size - len(set(always))]))
    coverage = counts[vocab].sum() / max(total, 1)
    return torch.tensor(vocab, dtype=torch.long), float(coverage)


@dataclass
class Batch:
    taps: torch.Tensor  # [S, W] context taps (positions 0..S-1)
    anchors: torch.Tensor  # [A] anchor positions
    block_ids: torch.Tensor  # [A, G] real tokens at anchor + j (Markov prev for position j+1), padded
    label_local: torch.Tensor  # [A, G] greedy target in draft-vocab index (-1 if outside the draft vocab)
    topk_local: torch.Tensor  # [A, G, K] top-k ids in draft-vocab index (-1 if outside)
    topk_p: torch.Tensor  # [A, G, K] their target probabilities
    valid: torch.Tensor  # [A, G] label exists
    hints: torch.Tensor | None = None  # [A, G] prompt lookup's proposals for anchor + 1 .. anchor + G (-1: none)


HINT_MEMO_SAMPLES = 4096  # samples whose hint tables each cache keeps (a sample is drawn many times in a run)
_hint_memo: "weakref.WeakKeyDictionary[Cache, OrderedDict]" = weakref.WeakKeyDictionary()


def sample_hints(cache: Cache, s: Sample, gamma: int, ngram: list[int]) -> torch.Tensor:
    """Prompt lookup's proposals at every anchor of `s` [n_tokens - prompt_len, gamma] (row r: anchor prompt_len + r;
    -1 where no n-gram matches), over the whole token list as the engine's index sees it. Memoised per cache
    (least recently used first out), since computing a table is quadratic in the sample's length."""
    memo = _hint_memo.setdefault(cache, OrderedDict())
    key = (s.id, s.tok_off, gamma, tuple(ngram))
    table = memo.get(key)
    if table is None:
        rows = lookup_table(cache.tokens(s).tolist(), gamma, ngram[0], ngram[1], start=s.prompt_len)
        table = np.full((len(rows), gamma), -1, np.int64)
        for r, draft in enumerate(rows):
            if draft:
                table[r] = draft
        table = memo[key] = torch.from_numpy(table)
        while len(memo) > HINT_MEMO_SAMPLES:
            memo.popitem(last=False)
    else:
        memo.move_to_end(key)
    return table


def make_batch(cache: Cache, s: Sample, n_anchors: int, gamma: int, to_local: torch.Tensor,
               rng: random.Random, hint_ngram: list[int] | None = None) -> Batch | None:
    """Anchors drawn from `s`'s answer and their teacher-forced targets; with `hint_ngram` ([min_n, max_n], a
    drafter's copy_hint_ngram) also prompt lookup's proposals at each anchor."""
    tokens = torch.from_numpy(cache.tokens(s).astype(np.int64))
    P, N = s.prompt_len, s.n_tokens
    candidates = list(range(P, N - 1))  # anchor p: context < p, predicts p+1 .. p+gamma
    if not candidates:
        return None
    anchors = sorted(rng.sample(candidates, min(n_anchors, len(candidates))))
    a = torch.tensor(anchors)
    pos = a[:, None] + torch.arange(gamma)  # [A, G] position of Markov prev x_{k-1}
    valid = pos + 1 < N
    block_ids = tokens[pos.clamp(max=N - 1)]
    ids, logp = cache.targets(s)
    rows = (pos + 1 - P).clamp(max=N - 1 - P)
    top_ids = torch.from_numpy(ids)[rows]  # [A, G, K]
    top_p = torch.from_numpy(logp)[rows].exp()
    top_local = to_local[top_ids]
    hints = sample_hints(cache, s, gamma, hint_ngram)[a - P] if hint_ngram else None
    return Batch(cache.taps(s)[: N - 1].float(), a, block_ids, top_local[..., 0], top_local, top_p, valid, hints)


def forward_blocks(model: DSparkDrafter, b: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher-forced forward for all anchors of one sample. Returns final hidden h [A, G, d], Markov-corrected
    draft logits [A, G, V_d] and confidence logits [A, G]."""
    cfg = model.config
    A, G = b.block_ids.shape
    S = b.taps.shape[0]
    dev = b.taps.device
    ctx = model.hidden_norm(model.fc(b.taps))  # [S, d]
    cos_c, sin_c = model.rope(torch.arange(S, device=dev))
    blk_pos = b.anchors[:, None] + torch.arange(G, device=dev)
    cos_b, sin_b = model.rope(blk_pos)
    if cfg.copy_hint_ngram is not None and b.hints is None:
        raise ValueError("a drafter with copy hints needs batches made with hint_ngram")
    x = model.embed_tokens(model.block_input_ids(b.block_ids[:, 0], b.hints))
    # Block queries see context tokens before their anchor and every token of their own block.
    ctx_mask = torch.arange(S, device=dev)[None, :] < b.anchors[:, None]  # [A, S]
    same = torch.eye(A, dtype=torch.bool, device=dev).repeat_interleave(G, 1)  # [A, A*G]
    mask = torch.cat((ctx_mask, same), 1).repeat_interleave(G, 0)  # [A*G, S + A*G]
    for layer in model.layers:
        attn = layer.self_attn
        xn = layer.input_layernorm(x)
        q = apply_rope(attn.q_norm(attn.q_proj(xn).unflatten(-1, (attn.n_heads, attn.hd))), cos_b, sin_b)
        kc, vc = attn.kv(ctx, cos_c, sin_c)
        kb, vb = attn.kv(xn, cos_b, sin_b)
        k = torch.cat((kc, kb.flatten(0, 1))).transpose(0, 1)[None]  # [1, Hkv, S + A*G, hd]
        v = torch.cat((vc, vb.flatten(0, 1))).transpose(0, 1)[None]
        o = F.scaled_dot_product_attention(q.flatten(0, 1).transpose(0, 1)[None], k, v, attn_mask=mask,
                                           scale=attn.hd ** -0.5, enable_gqa=True)
        x = x + attn.o_proj(o[0].transpose(0, 1).reshape(A, G, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    h = model.norm(x)
    logits = model.lm_head(h)
    e = model.markov_head.markov_w1(b.block_ids) if model.markov_head is not None else None
    if e is not None:
        logits = logits + model.markov_head.markov_w2(e)
    feats = torch.cat((h, e), -1) if cfg.confidence_head_with_markov else h
    return h, logits, model.confidence_head(feats)


def block_losses(logits, conf_logits, b: Batch) -> dict[str, torch.Tensor]:
    G = logits.shape[1]
    w = b.valid.float() * torch.exp(-torch.arange(G, dtype=torch.float) / POSITION_DECAY)
    p_d = logits.float().softmax(-1)
    pd_k = p_d.gather(-1, b.topk_local.clamp(min=0)) * (b.topk_local >= 0)
    l1 = (pd_k - b.topk_p).abs().sum(-1) + (1 - pd_k.sum(-1)).clamp(min=0)  # mass outside the top-k counts fully
    has_label = b.label_local >= 0
    ce = F.cross_entropy(logits.float().flatten(0, 1), b.label_local.clamp(min=0).flatten(), reduction="none")
    ce = ce.view_as(w) * has_label
    target_c = (1 - 0.5 * l1.detach()).clamp(0, 1)
    bce = F.binary_cross_entropy_with_logits(conf_logits.float(), target_c, reduction="none")
    norm = w.sum().clamp(min=1e-6)
    return {"ce": (w * ce).sum() / norm, "l1": (w * l1).sum() / norm, "conf": (w * bce).sum() / norm,
            "weight": norm}


@torch.no_grad()
def evaluate(model: DSparkDrafter, cache: Cache, samples: list[Sample], to_local, max_anchors: int = 64,
             seed: int = 0) -> dict:
    """Greedy drafting exactly as at inference (the Markov head sees its own drafts), scored against the cached
    answers, with the copy hints inference reads where the drafter has them. For greedily generated answers this is
    the real acceptance: tau = 1 + accepted prefix length."""
    rng = random.Random(seed)
    G = model.gamma
    accepted, total = np.zeros(G), 0
    taus, records = [], []
    for s in samples:
        b = make_batch(cache, s, max_anchors, G, to_local, rng, hint_ngram=model.config.copy_hint_ngram)
        if b is None:
            continue
        with mixed_precision():
            h, _, _ = forward_blocks(model, b)
        prop = model.decode(h.float(), b.block_ids[:, 0])
        target = torch.from_numpy(cache.tokens(s).astype(np.int64))
        pos = b.anchors[:, None] + torch.arange(G) + 1
        real = target[pos.clamp(max=s.n_tokens - 1)]
        match = (prop.tokens == real) & b.valid
        prefix = match.long().cumprod(1)
        accepted += prefix.sum(0).numpy()
        total += len(b.anchors)
        taus.extend((1 + prefix.sum(1)).tolist())
        records.append({"conf_logits": torch.logit(prop.confidence.double().clamp(1e-12, 1 - 1e-12)),
                        "accept_prefix": prefix, "valid": b.valid})
    return {"tau": float(np.mean(taus)) if taus else 0.0,
            "accept_rate_by_pos": (accepted / max(total, 1)).tolist(),
            "anchors": total, "records": records}


def local_index(model: DSparkDrafter) -> torch.Tensor:
    """Target id -> draft-vocabulary index (-1 outside it)."""
    V = model.config.vocab_size
    if model.draft_vocab is None:
        return torch.arange(V)
    to_local = torch.full((V,), -1, dtype=torch.long)
    to_local[model.draft_vocab] = torch.arange(len(model.draft_vocab))
    return to_local


def lr_at(step: int, tc: TrainConfig) -> float:
    warm = max(1, int(tc.steps * tc.warmup_frac))
    if step < warm:
        return tc.lr * (step + 1) / warm
    t = (step - warm) / max(1, tc.steps - warm)
    return tc.lr * 0.5 * (1 + math.cos(math.pi * t))


def export_checkpoint(target, ckpt_path: Path, out: Path, tap_layers: list[int],
                      dtype: torch.dtype | None = torch.bfloat16) -> dict:
    """Write a training checkpoint's drafter as a drafter folder (config.json + model.safetensors, cast to `dtype`),
    so a run still going can give its drafter so far. Returns the step and the last held-out evaluation."""
    state = torch.load(ckpt_path, weights_only=False)
    model = build_drafter(target, TrainConfig(**state["train_config"]), tap_layers, state["draft_vocab"])
    model.load_state_dict(state["model"], strict=False)  # the frozen embeddings and lm_head came from the target
    model.save_pretrained(out, include_embeddings=False, dtype=dtype)
    evals = [h for h in state["history"] if "eval_tau" in h]
    last = evals[-1] if evals else {}
    return {"step": state["step"], "heldout_tau": last.get("eval_tau"),
            "heldout_accept_by_pos": last.get("eval_accept_by_pos"), "train_config": state["train_config"]}


def train(target, train_cache: Cache, eval_cache: Cache | None, out: Path, tc: TrainConfig,
          tap_layers: list[int], eos_ids: list[int], log=print, stop_after: int | None = None,
          follow: bool = False, start_step: int = 0) -> DSparkDrafter:
    """Train (or resume) a drafter into `out`. Checkpoints go to out/checkpoint.pt; the result to out/drafter.
    `stop_after`: checkpoint and return after this many steps (a run cut short, to be resumed). `follow`: reopen
    the training cache at every checkpoint, so a run can start while another process still adds answers to it.
    `start_step`: where a warm start (`tc.init_from`) from a run's weights-only snapshot goes on: the step count and
    so the learning-rate schedule carry over, the optimizer's moments start afresh."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_path = out / "checkpoint.pt"
    state, base = None, None
    if ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False)
        tc = TrainConfig(**state["train_config"])
        draft_vocab = state["draft_vocab"]
        log(f"resuming from step {state['step']}")
    elif tc.init_from:
        base = DSparkDrafter.from_pretrained(tc.init_from, target_embed=target.get_input_embeddings().weight,
                                             target_lm_head=target.get_output_embeddings().weight)
        draft_vocab = base.draft_vocab if base.draft_vocab is not None else torch.arange(base.config.vocab_size)
        log(f"warm start from {tc.init_from} ({base.config.num_hidden_layers} layers)")
    else:
        draft_vocab, coverage = choose_draft_vocab(train_cache, tc.draft_vocab_size, eos_ids)
        log(f"draft vocabulary: {len(draft_vocab)} tokens cover {coverage:.2%} of the target's greedy tokens")
    model = build_drafter(target, tc, tap_layers, draft_vocab)
    if base is not None:
        warm_start(model, base)
    to_local = local_index(model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tc.lr, weight_decay=0.0, betas=(0.9, 0.95))
    step, history = start_step if state is None and tc.init_from else 0, []
    rng = random.Random(tc.seed + step)  # a resumed snapshot draws other samples than the steps it already took
    if state is not None:
        model.load_state_dict(state["model"], strict=False)
        opt.load_state_dict(state["optimizer"])
        step, history = state["step"], state["history"]
        rng.setstate(state["rng"])
    samples = [s for s in train_cache.samples if s.n_tokens - s.prompt_len > 2]
    eval_samples = [s for s in eval_cache.samples if s.temperature == 0.0][:200] if eval_cache else []
    bar = tqdm(total=tc.steps, initial=step, desc="train drafter", unit="step", smoothing=0.05)
    t0, positions = time.time(), 0
    model.train()
    last = min(tc.steps, stop_after) if stop_after else tc.steps
    while step < last:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, tc)
        opt.zero_grad(set_to_none=True)
        sums = {"ce": 0.0, "l1": 0.0, "conf": 0.0}
        for s in rng.sample(samples, tc.samples_per_step):
            b = make_batch(train_cache, s, tc.anchors_per_sample, tc.gamma, to_local, rng,
                           hint_ngram=model.config.copy_hint_ngram)
            if b is None:
                continue
            with mixed_precision():
                _, logits, conf = forward_blocks(model, b)
            losses = block_losses(logits, conf, b)
            loss = sum(LOSS_WEIGHTS[k] * losses[k] for k in LOSS_WEIGHTS) / tc.samples_per_step
            loss.backward()
            for k in sums:
                sums[k] += losses[k].item() / tc.samples_per_step
            positions += int(b.valid.sum())
        torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
        opt.step()
        step += 1
        rate = positions / max(time.time() - t0, 1e-6)
        bar.update(1)
        bar.set_postfix(ce=f"{sums['ce']:.3f}", l1=f"{sums['l1']:.3f}", conf=f"{sums['conf']:.3f}",
                        pos_s=f"{rate:.0f}")
        entry = {"step": step, **sums, "lr": lr_at(step - 1, tc)}
        if eval_samples and (step % tc.eval_every == 0 or step == tc.steps):
            model.eval()
            ev = evaluate(model, eval_cache, eval_samples, to_local)
            model.train()
            entry.update(eval_tau=ev["tau"], eval_accept_by_pos=ev["accept_rate_by_pos"])
            log(f"step {step}: held-out tau {ev['tau']:.3f}, acceptance by position "
                + " ".join(f"{a:.2f}" for a in ev["accept_rate_by_pos"]))
        history.append(entry)
        if step % tc.checkpoint_every == 0 or step in (tc.steps, last):
            tmp = ckpt_path.with_suffix(".tmp")
            torch.save({"model": {k: v for k, v in model.state_dict().items()
                                  if k not in ("embed_tokens.weight", "lm_head.weight")},
                        "optimizer": opt.state_dict(), "step": step, "history": history, "rng": rng.getstate(),
                        "train_config": asdict(tc), "draft_vocab": draft_vocab}, tmp)
            tmp.replace(ckpt_path)
            if follow:
                train_cache = Cache(train_cache.folder)
                grown = [s for s in train_cache.samples if s.n_tokens - s.prompt_len > 2]
                if len(grown) > len(samples):
                    log(f"step {step}: the training cache grew to {len(grown)} answers")
                    samples = grown
    bar.close()
    model.eval()
    if step < tc.steps:
        return model
    model.save_pretrained(out / "drafter", include_embeddings=False)
    (out / "history.json").write_text(json.dumps(history, indent=1))
    return model
