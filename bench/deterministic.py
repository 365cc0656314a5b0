"""What the deterministic (batch-invariant) mode costs: engine tokens/s with `deterministic` off and on.

For each concurrency (1, 4, 16, 64), on the same held-out chat prompts, two engines in this process (the default
model, one with deterministic=True) run the same requests in alternating rounds, so both see the same state of this
shared machine. Per level and mode: decode tokens/s (timed once every request has its first token, as
bench/engine_throughput.py times it) and the whole run's tokens/s with prefill (prompt and output tokens over wall
time). Ratios are on / off per round; the table gives their median.

    .venv/bin/python bench/deterministic.py                 # writes bench/results/deterministic.{json,png}
    .venv/bin/python bench/deterministic.py --quick         # fewer tokens and rounds, to check it runs
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.engine_throughput import chat_prompts, machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CONCURRENCY = [1, 4, 16, 64]


def run_level(engine, prompts, tag: str, new_tokens: int) -> dict:
    """All `prompts` at once to `new_tokens` each: decode tokens/s and tokens/s with prefill."""
    from engine import SamplingParams

    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    t0 = time.perf_counter()
    for rid, p in zip(ids, prompts):
        engine.add_request(rid, p, SamplingParams(max_tokens=new_tokens, ignore_eos=True))
    seqs = [engine.requests[r] for r in ids]
    while any(s.num_output_tokens == 0 for s in seqs):
        engine.step()
    t_first = time.perf_counter()
    tokens = 0
    while engine.has_unfinished_requests():
        tokens += sum(len(o.new_token_ids) for o in engine.step())
    t_end = time.perf_counter()
    total = sum(len(p) for p in prompts) + new_tokens * len(prompts)
    return {"decode_tok_s": tokens / (t_end - t_first), "total_tok_s": total / (t_end - t0),
            "prefill_s": t_first - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="16 new tokens, 1 round")
    ap.add_argument("--name", default="deterministic", help="results file stem under bench/results/")
    args = ap.parse_args()
    import torch

    from engine import EngineConfig, LLMEngine, SamplingParams

    new_tokens, rounds = (16, 1) if args.quick else (args.new_tokens, args.rounds)
    engines = {mode: LLMEngine(EngineConfig(dtype=args.dtype, device="cpu", max_num_seqs=64,
                                            max_num_batched_tokens=4096, kv_cache_memory_gb=0.5,
                                            deterministic=mode == "on"))
               for mode in ("off", "on")}
    prompts = chat_prompts(engines["off"].tokenizer, max(CONCURRENCY))
    for mode, engine in engines.items():  # warm-up: oneDNN builds a kernel per new batch shape on first use
        for conc in CONCURRENCY:
            for i, p in enumerate(prompts[:conc]):
                engine.add_request(f"warm{conc}-{i}", p, SamplingParams(max_tokens=4, ignore_eos=True))
            while engine.has_unfinished_requests():
                engine.step()
    runs: dict = {str(c): {"off": [], "on": []} for c in CONCURRENCY}
    for r in range(rounds):
        for conc in CONCURRENCY:
            for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
                res = run_level(engines[mode], prompts[:conc], f"r{r}-{conc}-{mode}", new_tokens)
                runs[str(conc)][mode].append(res)
                print(f"round {r} c={conc} {mode}: decode {res['decode_tok_s']:.0f} tok/s, with prefill "
                      f"{res['total_tok_s']:.0f} tok/s", flush=True)
    summary = {}
    for c, modes in runs.items():
        ratio = {k: median(on[k] / off[k] for on, off in zip(modes["on"], modes["off"]))
                 for k in ("decode_tok_s", "total_tok_s")}
        summary[c] = {"off": {k: median(x[k] for x in modes["off"]) for k in ("decode_tok_s", "total_tok_s")},
                      "on": {k: median(x[k] for x in modes["on"]) for k in ("decode_tok_s", "total_tok_s")},
                      "on_over_off": ratio}
    report = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"), "dtype": str(engines["off"].dtype),
              "threads": torch.get_num_threads(), "new_tokens": new_tokens, "rounds": rounds, "runs": runs,
              "summary": summary}
    RESULTS.mkdir(exist_ok=True)
    name = args.name + ("_quick" if args.quick else "")
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=1))
    plot(report, RESULTS / f"{name}.png")
    print("| concurrency | decode tok/s off | on | on / off | with prefill off | on | on / off |")
    print("|---|---|---|---|---|---|---|")
    for c, s in summary.items():
        print(f"| {c} | {s['off']['decode_tok_s']:.0f} | {s['on']['decode_tok_s']:.0f} | "
              f"{s['on_over_off']['decode_tok_s']:.2f} | {s['off']['total_tok_s']:.0f} | "
              f"{s['on']['total_tok_s']:.0f} | {s['on_over_off']['total_tok_s']:.2f} |")


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = report["summary"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, style in (("decode_tok_s", "-"), ("total_tok_s", "--")):
        for mode, color in (("off", "C0"), ("on", "C3")):
            axes[0].plot(CONCURRENCY, [summary[str(c)][mode][key] for c in CONCURRENCY], style, color=color,
                         marker="o", label=f"{key.removesuffix('_tok_s')}, deterministic {mode}")
        axes[1].plot(CONCURRENCY, [summary[str(c)]["on_over_off"][key] for c in CONCURRENCY], style, marker="o",
                     label=key.removesuffix("_tok_s"))
    axes[1].axhline(0.95, color="gray", lw=0.8, ls=":", label="goal 0.95")
    axes[1].axhline(1.0, color="black", lw=0.5)
    for ax, title, ylabel in ((axes[0], "tokens/s", "tokens/s"), (axes[1], "deterministic on / off", "ratio")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(CONCURRENCY, [str(c) for c in CONCURRENCY])
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.suptitle(f"deterministic mode, {report['dtype']}, {report['machine']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
