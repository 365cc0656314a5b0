"""The default drafter's report: acceptance, calibration and cost.

- tau (accepted + 1) at gamma = 7, greedy, on the held-out prompts, and the acceptance at each block position (a
  drafter with copy hints reads them as at inference: train.evaluate computes them); beside it, prompt lookup
  (n-gram matching over the prompt and the text so far, n = 3..1), the cheap rival to beat;
- calibration of the prefix survival prod c_k before and after Sequential Temperature Scaling (reliability curves and
  per-position ECE);
- the cost of one draft round against batch size 1..64, beside the target's plain decode step at the same batch: the
  round alone, and the round as the engine runs it (after a target step, with its context append).

Held-out answers come from the training run's cache when present (runs/default-drafter/cache/heldout), else from
bench/results/cache_heldout, which the target generates on the first run (a few minutes).

    .venv/bin/python bench/drafter_report.py        # writes bench/results/drafter_report.{json,png}
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
BATCHES = [1, 2, 4, 8, 16, 32, 64]


def prompt_lookup(tokens: np.ndarray, start: int, gamma: int, max_n: int = 3) -> list[tuple[int, int]]:
    """Per anchor, prompt lookup's (accepted drafts, n of the n-gram matched; 0 if none): find the latest earlier
    occurrence of the last n tokens (n = max_n..1) and propose what followed it."""
    out = []
    for p in range(start, len(tokens) - 1):
        ctx = tokens[: p + 1]
        draft: list[int] = []
        matched = 0
        for n in range(max_n, 0, -1):
            if len(ctx) <= n:
                continue
            key = ctx[-n:]
            for i in range(len(ctx) - n - 1, -1, -1):
                if np.array_equal(ctx[i: i + n], key):
                    draft, matched = ctx[i + n: i + n + gamma].tolist(), n
                    break
            if draft:
                break
        real = tokens[p + 1: p + 1 + gamma].tolist()
        a = 0
        while a < min(len(draft), len(real)) and draft[a] == real[a]:
            a += 1
        out.append((a, matched))
    return out


LOOKUP_BUCKETS = [(0, 0), (1, 2), (3, 6), (7, 7)]  # prompt lookup's accepted drafts at an anchor (gamma 7)


def drafter_vs_lookup(drafter_acc: np.ndarray, lookup_acc: np.ndarray, matched: np.ndarray) -> dict:
    """Where does the drafter lose to prompt lookup? Its tau at the anchors where lookup accepts 0, 1-2, 3-6, all;
    and the tau of a rule that takes lookup's draft where an n-gram of at least N tokens matched, else the drafter's."""
    buckets = []
    for lo, hi in LOOKUP_BUCKETS:
        m = (lookup_acc >= lo) & (lookup_acc <= hi)
        buckets.append({"lookup_accepts": f"{lo}-{hi}" if lo != hi else str(lo), "share": float(m.mean()),
                        "drafter_tau": 1 + float(drafter_acc[m].mean()), "lookup_tau": 1 + float(lookup_acc[m].mean())})
    rule = {str(n): 1 + float(np.where(matched >= n, lookup_acc, drafter_acc).mean()) for n in (1, 2, 3)}
    return {"by_lookup_accepted": buckets, "lookup_if_ngram_else_drafter_tau": rule,
            "oracle_best_of_both_tau": 1 + float(np.maximum(drafter_acc, lookup_acc).mean())}


def draft_costs(engine, service, batch: int, width: int, dtype, reps: int = 21) -> tuple[float, float, float]:
    """Median ms of (a plain target decode step, a draft round repeated back to back, a draft round as the engine runs
    it). The second is the round alone with the drafter's weights warm in cache; the third comes right after a target
    step (which streams the target's weights through the cache) and first appends the one new token of every context
    that a step of plain decoding adds. Contexts hold 160 tokens. Every shape runs before timing (oneDNN builds a kernel
    per new shape)."""
    from engine.drafter import ContextSync, DraftWork

    keys = [f"b{i}" for i in range(batch)]
    service.step([ContextSync(k, 0, torch.randn(160, width, dtype=dtype)) for k in keys], [])
    scratch = engine._scratch_seqs(batch, 160, 1)
    length, step_ms, hot_ms, in_step_ms = 160, [], [], []
    for i in range(reps + 3):
        t0 = time.perf_counter()
        engine.runner.execute(scratch)
        t1 = time.perf_counter()
        service.step([ContextSync(k, length, torch.randn(1, width, dtype=dtype)) for k in keys],
                     [DraftWork(k, 100 + j, length + 1) for j, k in enumerate(keys)])
        t2 = time.perf_counter()
        length += 1
        work = [DraftWork(k, 100 + j, length) for j, k in enumerate(keys)]
        service.step([], work)
        t3 = time.perf_counter()
        if i >= 3:
            step_ms.append(t1 - t0)
            in_step_ms.append(t2 - t1)
            hot_ms.append(t3 - t2)
    for s in scratch:
        engine.block_manager.free(s.seq)
    service.release(keys)
    return tuple(1000 * sorted(ts)[reps // 2] for ts in (step_ms, hot_ms, in_step_ms))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drafter", default="default")
    ap.add_argument("--cache", default=str(ROOT / "runs" / "default-drafter" / "cache" / "heldout"))
    ap.add_argument("--name", default="drafter_report", help="writes bench/results/NAME.{json,png}")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM

    from draft_service.calibrate import ece, survival, survival_ece
    from draft_service.data import Cache, generate_cache
    from draft_service.model import DSparkDrafter
    from draft_service.pipeline import load_prompt_file
    from draft_service.train import evaluate, local_index
    from draft_service.calibrate import stack_records
    from engine import EngineConfig, LLMEngine
    from engine.loader import DEFAULT_DRAFTER, resolve_model

    drafter_dir = DEFAULT_DRAFTER if args.drafter == "default" else Path(args.drafter)
    cache_dir = Path(args.cache)
    engine = LLMEngine(EngineConfig(drafter=str(drafter_dir), max_num_seqs=64, kv_cache_memory_gb=1.0))
    # Cost first, while the process holds only the serving engine: after the evaluation below (the float32 target and
    # the cache loaded) the same measurements ran 30-40% slower (12.3 vs 8.8 ms a target step at batch 1).
    service = engine.speculator.service
    width = len(engine.tap_layers) * engine.model.hidden_size
    costs = {b: draft_costs(engine, service, b, width, engine.dtype) for b in BATCHES}
    costs_report = {
        "target_step_ms": {b: c[0] for b, c in costs.items()},
        "draft_round_ms": {b: c[1] for b, c in costs.items()},
        "draft_round_in_step_ms": {b: c[2] for b, c in costs.items()},
        "draft_over_step": {b: c[1] / c[0] for b, c in costs.items()},
        "draft_in_step_over_step": {b: c[2] / c[0] for b, c in costs.items()},
    }
    if not (cache_dir / "index.jsonl").exists():
        cache_dir = RESULTS / "cache_heldout"  # generated once, reused by later runs (delete it to regenerate)
    if not (cache_dir / "index.jsonl").exists():
        gen = LLMEngine(EngineConfig(tap_layers=list(engine.tap_layers), max_num_seqs=64))
        generate_cache(gen, load_prompt_file("heldout"), cache_dir, temperatures=[0.0], max_tokens=256)
        del gen
    cache = Cache(cache_dir)
    samples = [s for s in cache.samples if s.temperature == 0.0]

    # Acceptance, exactly as greedy inference drafts (float32 copy of the drafter, uncalibrated logits).
    target = AutoModelForCausalLM.from_pretrained(resolve_model(None), dtype=torch.float32).eval()
    drafter = DSparkDrafter.from_pretrained(drafter_dir, target_embed=target.get_input_embeddings().weight,
                                            target_lm_head=target.get_output_embeddings().weight,
                                            dtype=torch.float32)
    temps = drafter.conf_temperatures
    drafter.conf_temperatures = None
    ev = evaluate(drafter, cache, samples, local_index(drafter), max_anchors=10**6)
    z, y, v = stack_records(ev.pop("records"))
    gamma = z.shape[1]
    temps_np = temps.numpy() if temps is not None else np.ones(gamma)
    cond = [float(y[v[:, k] & (y[:, k - 1] > 0) if k else v[:, 0], k].mean()) for k in range(gamma)]
    lookup = np.array([m for s in samples for m in prompt_lookup(cache.tokens(s).astype(np.int64), s.prompt_len,
                                                                  gamma)]).reshape(-1, 2)
    assert len(lookup) == len(y), "evaluate() scored every anchor of every answer, in order"
    report = {
        **costs_report, "drafter": str(drafter_dir), "gamma": gamma, "heldout_answers": len(samples), "anchors": ev["anchors"],
        "copy_hint_ngram": drafter.config.copy_hint_ngram,
        "tau": ev["tau"], "accept_rate_by_pos": ev["accept_rate_by_pos"], "conditional_accept_by_pos": cond,
        "prompt_lookup_tau": 1 + float(lookup[:, 0].mean()),
        "drafter_vs_lookup": drafter_vs_lookup(y.sum(1), lookup[:, 0], lookup[:, 1]),
        "ece_before": survival_ece(z, y, v, np.ones(gamma)), "ece_after": survival_ece(z, y, v, temps_np),
        "sts_temperatures": temps_np.tolist(),
    }
    # Reliability: predicted survival vs observed prefix acceptance, pooled over positions.
    for name, t in (("before", np.ones(gamma)), ("after", temps_np)):
        s = survival(z, t)[v]
        lab = y[v]
        idx = np.minimum((s * 10).astype(int), 9)
        report[f"reliability_{name}"] = [(float(s[idx == b].mean()), float(lab[idx == b].mean()), int((idx == b).sum()))
                                         for b in range(10) if (idx == b).any()]
        report[f"ece_pooled_{name}"] = ece(s, lab)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    plot(report, RESULTS / f"{args.name}.png")
    print(json.dumps({k: report[k] for k in ("tau", "prompt_lookup_tau", "drafter_vs_lookup", "accept_rate_by_pos",
                                             "conditional_accept_by_pos", "ece_pooled_before", "ece_pooled_after",
                                             "draft_round_ms", "draft_round_in_step_ms", "target_step_ms",
                                             "draft_over_step", "draft_in_step_over_step")}, indent=1))


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(22, 4.8))
    ks = list(range(1, r["gamma"] + 1))
    ax = axes[0]
    ax.bar([k - 0.2 for k in ks], r["conditional_accept_by_pos"], width=0.4, label="P(accept k | 1..k-1 accepted)")
    ax.bar([k + 0.2 for k in ks], r["accept_rate_by_pos"], width=0.4, label="P(1..k all accepted)")
    ax.set_title(f"held-out greedy: tau = {r['tau']:.2f} (prompt lookup {r['prompt_lookup_tau']:.2f})")
    ax.set_xlabel("block position k")
    ax.legend(fontsize=8)
    ax = axes[1]
    for name, style in (("before", "o--"), ("after", "s-")):
        pts = r[f"reliability_{name}"]
        ax.plot([p for p, _, _ in pts], [o for _, o, _ in pts], style,
                label=f"{name} STS (ECE {r[f'ece_pooled_{name}']:.3f})")
    ax.plot([0, 1], [0, 1], color="gray", lw=0.8)
    ax.set_xlabel("predicted prefix survival prod c")
    ax.set_ylabel("observed prefix acceptance")
    ax.set_title("calibration")
    ax.legend(fontsize=8)
    ax = axes[2]
    bs = [int(b) for b in r["draft_round_ms"]]
    ax.plot(bs, list(r["draft_round_ms"].values()), "o-", label="draft round (back to back)")
    if "draft_round_in_step_ms" in r:
        ax.plot(bs, list(r["draft_round_in_step_ms"].values()), "^-",
                label="draft round after a target step, with a 1-token append")
    ax.plot(bs, list(r["target_step_ms"].values()), "s-", label="target decode step")
    ax.set_xscale("log", base=2)
    ax.set_xticks(bs, [str(b) for b in bs])
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("ms")
    ax.set_title("cost per step")
    ax.legend(fontsize=8)
    ax = axes[3]
    dv = r["drafter_vs_lookup"]
    rows = dv["by_lookup_accepted"]
    xs = np.arange(len(rows))
    ax.bar(xs - 0.2, [b["drafter_tau"] for b in rows], width=0.4, label="drafter")
    ax.bar(xs + 0.2, [b["lookup_tau"] for b in rows], width=0.4, label="prompt lookup")
    ax.set_xticks(xs, [f"{b['lookup_accepts']}\n{b['share']:.0%} of anchors" for b in rows])
    ax.set_xlabel("anchors by prompt lookup's accepted drafts")
    ax.set_ylabel("tau")
    rule = dv["lookup_if_ngram_else_drafter_tau"]
    ax.set_title(f"lookup where a 2-gram matches, else the drafter: tau {rule['2']:.2f}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
