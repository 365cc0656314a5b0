"""Speculative decoding under continuous batching: every speculation mode at every concurrency, on two content mixes,
with the default model and drafter, in one run.

Modes: off, fixed:1,2,3,5,7, threshold:0.8, adaptive. Concurrency: 1, 4, 16, 64 (that many requests at once).
Mixes: `in_domain` = held-out chat prompts, greedy; `hard` = the out-of-domain prompt split sampled at
temperature 1.0. Every request generates exactly --new-tokens tokens (ignore_eos), so sampled answers of different
lengths do not skew the cells. One engine per mix; the mode is set per request, and modes are interleaved within
each concurrency so they see the same machine state; the whole sweep is repeated --repeats times and each cell
reports its median round (this machine is shared and noisy). `adaptive` runs next to `off`, the order flips every
round, and `paired` gives the median over rounds of each round's adaptive / off and adaptive / best fixed ratios.
Before the rounds, one unmeasured `adaptive` cell per concurrency lets the draft gate explore its load buckets, as
a running server's gate has.
Metrics per cell: output tokens/s (all tokens of the batch over its wall time, prefill included), mean per-request
TPOT, mean verify length, and tokens per speculative step.

    .venv/bin/python bench/spec_decode.py           # writes bench/results/spec_decode.{json,png}
    .venv/bin/python bench/spec_decode.py --quick   # concurrency 1 and 4, 32 new tokens
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ["off", "fixed:1", "fixed:2", "fixed:3", "fixed:5", "fixed:7", "threshold:0.8", "adaptive"]
CONCURRENCY = [1, 4, 16, 64]
MIXES = {"in_domain": ("heldout", 0.0), "hard": ("hard", 1.0)}


def run_cell(engine, prompts, mode: str, temperature: float, new_tokens: int, seed: int) -> dict:
    from engine import SamplingParams

    spec = engine.speculator
    before = (spec.counters.draft_tokens, spec.counters.drafts, spec.counters.accepted_tokens,
              sum(spec.counters.verify_length_hist), sum(i * n for i, n in enumerate(spec.counters.verify_length_hist)))
    ids = [f"{mode}-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
    t0 = time.perf_counter()
    for i, (rid, p) in enumerate(zip(ids, prompts)):
        engine.add_request(rid, p, SamplingParams(max_tokens=new_tokens, temperature=temperature, ignore_eos=True,
                                                  seed=seed + i if temperature else None, speculation=mode))
    outs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                outs[o.request_id] = o
    elapsed = time.perf_counter() - t0
    tokens = sum(len(o.token_ids) for o in outs.values())
    tpots = [o.metrics["tpot_s"] for o in outs.values() if "tpot_s" in o.metrics]
    c = spec.counters
    drafted_seqs = sum(c.verify_length_hist) - before[3]
    verified = sum(i * n for i, n in enumerate(c.verify_length_hist)) - before[4]
    drafts = c.drafts - before[1]
    accepted = c.accepted_tokens - before[2]
    return {
        "tok_s": tokens / elapsed,
        "tpot_ms": 1000 * sum(tpots) / max(len(tpots), 1),
        "mean_verify_len": verified / max(drafted_seqs, 1),
        # per sequence per decode step, skipped draft rounds included: every step emits 1 + accepted per sequence
        "verify_per_seq_step": verified / max(tokens - accepted, 1),
        "tokens_per_spec_step": 1 + (c.accepted_tokens - before[2]) / max(drafts, 1),
        "acceptance_rate": (c.accepted_tokens - before[2]) / max(c.draft_tokens - before[0], 1),
        "tokens": tokens, "seconds": elapsed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--drafter", default="default")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    concs = [1, 4] if args.quick else CONCURRENCY
    n_new = 32 if args.quick else args.new_tokens

    from draft_service.prompts import load_prompts
    from engine import EngineConfig, LLMEngine

    report = {"new_tokens": n_new, "repeats": args.repeats, "date": time.strftime("%Y-%m-%d %H:%M"), "mixes": {}}
    for mix, (split, temperature) in MIXES.items():
        engine = LLMEngine(EngineConfig(drafter=args.drafter, max_num_seqs=64, max_num_batched_tokens=2048,
                                        kv_cache_memory_gb=1.0))
        if engine.speculator is None:
            raise SystemExit(f"no speculation: {engine.drafter_error}")
        records = load_prompts(split)
        prompts = [list(engine.tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True,
                                                             tokenize=True, return_dict=True)["input_ids"])
                   for r in records[: max(concs)]]
        # Warm-up, not measured: a server's draft gate has long since explored the load buckets it sees (a bucket
        # drafts for its first 64 sequence-steps before it may close); here every cell is a fresh batch.
        for conc in concs:
            run_cell(engine, prompts[:conc], "adaptive", temperature, n_new, seed=conc)
        rounds: dict[str, list[dict]] = {}
        for rep in range(args.repeats):
            for conc in concs:
                # adaptive runs right beside off, and the order flips every round (ABBA), so that the paired
                # per-round ratios below compare cells a few seconds apart on this drifting machine
                order = ["off", "adaptive"] + [m for m in MODES if m not in ("off", "adaptive")]
                for mode in order if rep % 2 == 0 else order[::-1]:
                    res = run_cell(engine, prompts[:conc], mode, temperature, n_new, seed=conc)
                    rounds.setdefault(f"{mode}@{conc}", []).append(res)
                    print(f"{mix:9s} round {rep} conc {conc:3d} {mode:14s} {res['tok_s']:7.1f} tok/s  "
                          f"tpot {res['tpot_ms']:6.1f} ms  verify {res['mean_verify_len']:.2f}  "
                          f"tokens/step {res['tokens_per_spec_step']:.2f}", flush=True)
        cells = {}
        for key, runs in rounds.items():
            cells[key] = dict(sorted(runs, key=lambda r: r["tok_s"])[len(runs) // 2])  # the median round
            cells[key]["tok_s_rounds"] = [r["tok_s"] for r in runs]
            cells[key]["verify_per_seq_step"] = sum(r["verify_per_seq_step"] for r in runs) / len(runs)
        paired = {}
        for conc in concs:
            per_round = [{m: rounds[f"{m}@{conc}"][i]["tok_s"] for m in MODES} for i in range(args.repeats)]
            vs_off = [r["adaptive"] / r["off"] for r in per_round]
            vs_fixed = [r["adaptive"] / max(r[m] for m in MODES if m.startswith("fixed:")) for r in per_round]
            paired[str(conc)] = {"adaptive_vs_off": statistics.median(vs_off), "adaptive_vs_off_rounds": vs_off,
                                 "adaptive_vs_best_fixed": statistics.median(vs_fixed),
                                 "adaptive_vs_best_fixed_rounds": vs_fixed}
        report["mixes"][mix] = {"temperature": temperature, "prompts": split, "cells": cells, "paired": paired,
                                "sps_table": engine.speculator.cost.table()}
    RESULTS.mkdir(exist_ok=True)
    name = "spec_decode" + ("_quick" if args.quick else "")
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=1))
    plot(report, concs, RESULTS / f"{name}.png")
    print_table(report, concs)


def plot(report: dict, concs: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mixes = list(report["mixes"])
    fig, axes = plt.subplots(1, len(mixes) + 1, figsize=(6 * (len(mixes) + 1), 4.8))
    for ax, mix in zip(axes, mixes):
        cells = report["mixes"][mix]["cells"]
        off = [cells[f"off@{c}"]["tok_s"] for c in concs]
        paired = report["mixes"][mix].get("paired")
        for mode in MODES:
            ys = [cells[f"{mode}@{c}"]["tok_s"] / o for c, o in zip(concs, off)]
            label = mode
            if mode == "adaptive" and paired:  # as the table: the median of its per-round ratios to the off beside it
                ys, label = [paired[str(c)]["adaptive_vs_off"] for c in concs], "adaptive (paired)"
            ax.plot(concs, ys, marker="o", lw=2.5 if mode == "adaptive" else 1, label=label,
                    color="black" if mode == "adaptive" else None)
        ax.set_title(f"{mix}: throughput relative to off (median cells)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(concs, [str(c) for c in concs])
        ax.set_xlabel("concurrency")
        ax.set_ylabel("tokens/s / off")
        ax.axhline(1.0, color="gray", lw=0.8, ls=":")
        ax.legend(fontsize=7)
    ax = axes[-1]
    for mix in mixes:
        cells = report["mixes"][mix]["cells"]
        ax.plot(concs, [cells[f"adaptive@{c}"]["verify_per_seq_step"] for c in concs], marker="o", label=mix)
    ax.set_title("adaptive: mean verify length (all rounds)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(concs, [str(c) for c in concs])
    ax.set_xlabel("concurrency")
    ax.set_ylabel("draft tokens verified per sequence per step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_table(report: dict, concs: list[int]) -> None:
    """The README's tables: median-round tokens/s (mean TPOT ms) per cell, then the paired ratios."""
    for mix, data in report["mixes"].items():
        cells, paired = data["cells"], data["paired"]
        print(f"\n**{mix}** (T={data['temperature']}): output tokens/s (mean TPOT ms), median of {report['repeats']} "
              "rounds; last columns: adaptive / best fixed and adaptive / off (medians of the per-round ratios), "
              "adaptive's verify length per sequence-step\n")
        print("| conc | " + " | ".join(MODES) + " | adaptive/best fixed | adaptive/off | verify len |")
        print("|---" * (len(MODES) + 4) + "|")
        for c in concs:
            row = [f"{cells[f'{m}@{c}']['tok_s']:.0f} ({cells[f'{m}@{c}']['tpot_ms']:.0f})" for m in MODES]
            p = paired[str(c)]
            print(f"| {c} | " + " | ".join(row) + f" | {p['adaptive_vs_best_fixed']:.2f} | "
                  f"{p['adaptive_vs_off']:.2f} | {cells[f'adaptive@{c}']['verify_per_seq_step']:.2f} |")


if __name__ == "__main__":
    main()
