"""Speculative decoding under continuous batching: every speculation mode at every concurrency, on two content mixes,
with the default model and drafter, in one run.

Modes: off, fixed:1,2,3,5,7, threshold:0.8, adaptive (the DSpark drafter alone), and adaptive+lookup (prompt
lookup where an n-gram of the text matches, the drafter elsewhere; engine/ngram.py). Concurrency: 1, 4, 16, 64 (that
many requests at once); --modes runs a subset (off is always in).
Mixes: `in_domain` = held-out chat prompts, greedy; `hard` = the out-of-domain prompt split sampled at
temperature 1.0. Every request generates exactly --new-tokens tokens (ignore_eos), so sampled answers of different
lengths do not skew the cells. One engine per mix; the mode is set per request, and modes are interleaved within
each concurrency so they see the same machine state; the whole sweep is repeated --repeats times and each cell
reports its median round (this machine is shared and noisy). The adaptive modes run next to `off`, the order flips
every round, and `paired` gives, for each adaptive mode, the median over rounds of each round's ratio to off and to
the best fixed mode (`best_fixed_mode`: the fixed mode with the highest median tok/s, one mode for all rounds).
Before the rounds, one unmeasured cell per adaptive mode and concurrency lets the draft gate explore its load buckets, as
a running server's gate has.
Metrics per cell: output tokens/s (all tokens of the batch over its wall time, prefill included), mean per-request
TPOT, mean verify length, and tokens per speculative step.
A cell is static batches by default: at concurrency c, ceil(--min-requests / c) batches of c different prompts run
back to back (4 prompts one at a time at concurrency 1, one batch from 4 up), and a batch's tok/s waits for its
slowest request: speculation speeds some answers up more than others, and the batch's last steps run fewer sequences
at nearly the price of all. --waves W instead keeps `conc` requests in flight over W x conc requests (continuous
arrivals, as a loaded server has) and counts tok/s while the queue lasts.

    .venv/bin/python bench/spec_decode.py           # writes bench/results/spec_decode.{json,png}
    .venv/bin/python bench/spec_decode.py --quick   # concurrency 1 and 4, 32 new tokens
    .venv/bin/python bench/spec_decode.py --modes adaptive,adaptive+lookup --name spec_decode_lookup
    .venv/bin/python bench/spec_decode.py --modes adaptive,adaptive+lookup --waves 3 --name spec_decode_sustained
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ["off", "fixed:1", "fixed:2", "fixed:3", "fixed:5", "fixed:7", "threshold:0.8", "adaptive", "adaptive+lookup"]
CONCURRENCY = [1, 4, 16, 64]
MIXES = {"in_domain": ("heldout", 0.0), "hard": ("hard", 1.0)}


# --penalties: what OpenAI clients commonly send (they change the target's law; speculation stays lossless)
PENALTIES = {"presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.1}


def run_cell(engine, prompts, mode: str, temperature: float, new_tokens: int, seed: int, conc: int | None = None,
             penalties: dict | None = None) -> dict:
    """Run `prompts` with at most `conc` in flight (default: all at once, one static batch). With more prompts than
    `conc`, a finished request's slot is refilled by the next prompt, and tok_s counts only the tokens emitted while
    the queue lasted (every slot busy), so the batch's tail, its last requests running alone, is left out."""
    from engine import SamplingParams

    conc = conc or len(prompts)
    spec = engine.speculator
    before = (spec.counters.draft_tokens, spec.counters.drafts, spec.counters.accepted_tokens,
              sum(spec.counters.verify_length_hist), sum(i * n for i, n in enumerate(spec.counters.verify_length_hist)))
    stamp = time.monotonic_ns()
    queue = list(enumerate(prompts))

    def submit() -> None:
        i, p = queue.pop(0)
        engine.add_request(f"{mode}-{stamp}-{i}", p, SamplingParams(
            max_tokens=new_tokens, temperature=temperature, ignore_eos=True, seed=seed + i if temperature else None,
            speculation=mode, **(penalties or {})))

    t0 = time.perf_counter()
    for _ in range(min(conc, len(queue))):
        submit()
    outs, window_tokens, window_end = {}, 0, None
    while engine.has_unfinished_requests():
        step_outs = engine.step()
        if window_end is None:
            window_tokens += sum(len(o.new_token_ids) for o in step_outs)
        for o in step_outs:
            if o.finished:
                outs[o.request_id] = o
                if queue:
                    submit()
                elif window_end is None and len(prompts) > conc:
                    window_end = time.perf_counter()
    elapsed = time.perf_counter() - t0
    tokens = sum(len(o.token_ids) for o in outs.values())
    tpots = [o.metrics["tpot_s"] for o in outs.values() if "tpot_s" in o.metrics]
    c = spec.counters
    return {"tokens": tokens, "seconds": elapsed, "tpots": tpots,
            "window_tokens": window_tokens if window_end else tokens,
            "window_seconds": window_end - t0 if window_end else elapsed,
            "drafted_seqs": sum(c.verify_length_hist) - before[3],
            "verified": sum(i * n for i, n in enumerate(c.verify_length_hist)) - before[4],
            "drafts": c.drafts - before[1], "accepted": c.accepted_tokens - before[2],
            "draft_tokens": c.draft_tokens - before[0]}


def summarize(parts: list[dict]) -> dict:
    """One cell's figures from the run_cell results of its consecutive batches."""
    n = {k: sum(p[k] for p in parts) for k in parts[0] if k != "tpots"}
    tpots = [t for p in parts for t in p["tpots"]]
    return {
        "tok_s": n["window_tokens"] / n["window_seconds"],
        "tpot_ms": 1000 * sum(tpots) / max(len(tpots), 1),
        "mean_verify_len": n["verified"] / max(n["drafted_seqs"], 1),
        # per sequence per decode step, skipped draft rounds included: every step emits 1 + accepted per sequence
        "verify_per_seq_step": n["verified"] / max(n["tokens"] - n["accepted"], 1),
        "tokens_per_spec_step": 1 + n["accepted"] / max(n["drafts"], 1),
        "acceptance_rate": n["accepted"] / max(n["draft_tokens"], 1),
        "tokens": n["tokens"], "seconds": n["seconds"], "requests": len(tpots),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--drafter", default="default")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    ap.add_argument("--name", default="spec_decode", help="writes bench/results/NAME.{json,png}")
    ap.add_argument("--waves", type=int, default=1,
                    help="1: each cell is one static batch of `conc` requests; W > 1: W x conc requests, `conc` in "
                         "flight (a finished one replaced by the next), tok/s counted while the queue lasts")
    ap.add_argument("--min-requests", type=int, default=4,
                    help="static batches: a cell at concurrency c runs ceil(N / c) batches of c different prompts back "
                         "to back, so that a low-concurrency cell is not one prompt's answer")
    ap.add_argument("--concurrency", default=None, help="comma-separated levels (default 1,4,16,64; --quick 1,4)")
    ap.add_argument("--mixes", default=",".join(MIXES), help="comma-separated subset of " + ",".join(MIXES))
    ap.add_argument("--penalties", action="store_true", help="every request carries PENALTIES")
    args = ap.parse_args()
    modes = ["off"] + [m for m in MODES if m != "off" and m in args.modes.split(",")]
    adaptive_modes = [m for m in modes if m.startswith("adaptive")]
    fixed_modes = [m for m in modes if m.startswith("fixed:")]
    concs = [1, 4] if args.quick else CONCURRENCY
    if args.concurrency:
        concs = [int(c) for c in args.concurrency.split(",")]
    mixes = {m: MIXES[m] for m in args.mixes.split(",")}
    n_new = 32 if args.quick else args.new_tokens
    penalties = PENALTIES if args.penalties else None

    from draft_service.prompts import load_prompts
    from engine import EngineConfig, LLMEngine

    report = {"new_tokens": n_new, "repeats": args.repeats, "date": time.strftime("%Y-%m-%d %H:%M"), "modes": modes,
              "waves": args.waves, "min_requests": args.min_requests if args.waves == 1 else None, "mixes": {},
              "penalties": penalties}
    for mix, (split, temperature) in mixes.items():
        engine = LLMEngine(EngineConfig(drafter=args.drafter, max_num_seqs=64, max_num_batched_tokens=2048,
                                        kv_cache_memory_gb=1.0))
        if engine.speculator is None:
            raise SystemExit(f"no speculation: {engine.drafter_error}")
        records = load_prompts(split)
        batches = {c: 1 if args.waves > 1 else -(-args.min_requests // c) for c in concs}
        needed = max(c * max(args.waves, batches[c]) for c in concs)
        if len(records) < needed:
            raise SystemExit(f"{split} has {len(records)} prompts, fewer than the {needed} needed")
        prompts = [list(engine.tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True,
                                                             tokenize=True, return_dict=True)["input_ids"])
                   for r in records[:needed]]

        def cell(mode: str, conc: int) -> dict:
            if args.waves > 1:
                return summarize([run_cell(engine, prompts[:conc * args.waves], mode, temperature, n_new, seed=conc,
                                           conc=conc, penalties=penalties)])
            return summarize([run_cell(engine, prompts[b * conc:(b + 1) * conc], mode, temperature, n_new,
                                       seed=1000 * b + conc, penalties=penalties) for b in range(batches[conc])])
        # Warm-up, not measured: a server's draft gate has long since explored the load buckets it sees (a bucket
        # drafts for its first 64 sequence-steps before it may close); here every cell is a fresh batch.
        for conc in concs:
            for mode in adaptive_modes:
                cell(mode, conc)
        rounds: dict[str, list[dict]] = {}
        for rep in range(args.repeats):
            for conc in concs:
                # adaptive runs right beside off, and the order flips every round (ABBA), so that the paired
                # per-round ratios below compare cells a few seconds apart on this drifting machine
                order = ["off"] + adaptive_modes + [m for m in modes if m != "off" and m not in adaptive_modes]
                for mode in order if rep % 2 == 0 else order[::-1]:
                    res = cell(mode, conc)
                    rounds.setdefault(f"{mode}@{conc}", []).append(res)
                    print(f"{mix:9s} round {rep} conc {conc:3d} {mode:15s} {res['tok_s']:7.1f} tok/s  "
                          f"tpot {res['tpot_ms']:6.1f} ms  verify {res['mean_verify_len']:.2f}  "
                          f"tokens/step {res['tokens_per_spec_step']:.2f}", flush=True)
        cells = {}
        for key, runs in rounds.items():
            cells[key] = dict(sorted(runs, key=lambda r: r["tok_s"])[len(runs) // 2])  # the median round
            cells[key]["tok_s_rounds"] = [r["tok_s"] for r in runs]
            cells[key]["verify_per_seq_step"] = sum(r["verify_per_seq_step"] for r in runs) / len(runs)
        paired = {}  # per concurrency: "<adaptive mode>_vs_off", "<adaptive mode>_vs_best_fixed", and their rounds
        for conc in concs:
            per_round = [{m: rounds[f"{m}@{conc}"][i]["tok_s"] for m in modes} for i in range(args.repeats)]
            paired[str(conc)] = cell = {}
            # The best fixed k is one policy, picked by its median over the rounds: the best of five noisy cells in
            # each round would be an oracle that picks after seeing the noise, biased against any single mode.
            best = max(fixed_modes, key=lambda m: statistics.median(r[m] for r in per_round)) if fixed_modes else None
            if best:
                cell["best_fixed_mode"] = best
            for a in adaptive_modes:
                vs = {"off": [r[a] / r["off"] for r in per_round]}
                if best:
                    vs["best_fixed"] = [r[a] / r[best] for r in per_round]
                for other, ratios in vs.items():
                    cell[f"{a}_vs_{other}"], cell[f"{a}_vs_{other}_rounds"] = statistics.median(ratios), ratios
        report["mixes"][mix] = {"temperature": temperature, "prompts": split, "cells": cells, "paired": paired,
                                "sps_table": engine.speculator.cost.table()}
    RESULTS.mkdir(exist_ok=True)
    name = args.name + ("_quick" if args.quick else "")
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=1))
    plot(report, concs, RESULTS / f"{name}.png")
    print_table(report, concs)


def plot(report: dict, concs: list[int], path: Path) -> None:
    modes = report.get("modes", MODES)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mixes = list(report["mixes"])
    fig, axes = plt.subplots(1, len(mixes) + 1, figsize=(6 * (len(mixes) + 1), 4.8))
    for ax, mix in zip(axes, mixes):
        cells = report["mixes"][mix]["cells"]
        off = [cells[f"off@{c}"]["tok_s"] for c in concs]
        paired = report["mixes"][mix].get("paired")
        for mode in modes:
            ys = [cells[f"{mode}@{c}"]["tok_s"] / o for c, o in zip(concs, off)]
            label = mode
            if mode.startswith("adaptive") and paired:  # as the table: the median of the per-round ratios to off
                ys, label = [paired[str(c)][f"{mode}_vs_off"] for c in concs], f"{mode} (paired)"
            ax.plot(concs, ys, marker="o", lw=2.5 if mode.startswith("adaptive") else 1, label=label,
                    color={"adaptive": "black", "adaptive+lookup": "tab:red"}.get(mode))
        load = f"{report['waves']} waves in flight" if report.get("waves", 1) > 1 else "static batches"
        ax.set_title(f"{mix}, {load}: throughput relative to off")
        ax.set_xscale("log", base=2)
        ax.set_xticks(concs, [str(c) for c in concs])
        ax.set_xlabel("concurrency")
        ax.set_ylabel("tokens/s / off")
        ax.axhline(1.0, color="gray", lw=0.8, ls=":")
        ax.legend(fontsize=7)
    ax = axes[-1]
    for mix in mixes:
        cells = report["mixes"][mix]["cells"]
        for mode in (m for m in modes if m.startswith("adaptive")):
            ax.plot(concs, [cells[f"{mode}@{c}"]["verify_per_seq_step"] for c in concs], marker="o",
                    label=f"{mix}, {mode}", ls="-" if mode == "adaptive" else "--")
    ax.set_title("adaptive modes: mean verify length (all rounds)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(concs, [str(c) for c in concs])
    ax.set_xlabel("concurrency")
    ax.set_ylabel("draft tokens verified per sequence per step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_table(report: dict, concs: list[int]) -> None:
    """The README's tables: median-round tokens/s (mean TPOT ms) per cell, then the paired ratios of each adaptive
    mode (medians of the per-round ratios) and its verify length per sequence-step."""
    modes = report.get("modes", MODES)
    for mix, data in report["mixes"].items():
        cells, paired = data["cells"], data["paired"]
        ratios = [k for k in paired[str(concs[0])] if "_vs_" in k and not k.endswith("_rounds")]
        adaptive = [m for m in modes if m.startswith("adaptive")]
        print(f"\n**{mix}** (T={data['temperature']}): output tokens/s (mean TPOT ms), median of {report['repeats']} "
              "rounds; then the paired ratios and the verify lengths\n")
        print("| conc | " + " | ".join(modes) + " | " + " | ".join(k.replace("_vs_", " / ") for k in ratios)
              + " | " + " | ".join(f"{m} verify len" for m in adaptive) + " |")
        print("|---" * (1 + len(modes) + len(ratios) + len(adaptive)) + "|")
        for c in concs:
            row = [f"{cells[f'{m}@{c}']['tok_s']:.0f} ({cells[f'{m}@{c}']['tpot_ms']:.0f})" for m in modes]
            row += [f"{paired[str(c)][k]:.2f}" for k in ratios]
            row += [f"{cells[f'{m}@{c}']['verify_per_seq_step']:.2f}" for m in adaptive]
            print(f"| {c} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
