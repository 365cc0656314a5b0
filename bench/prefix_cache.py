"""Automatic prefix caching on a chat workload whose requests share a long system prompt, with and without caching,
in one run.

Every request is the same system prompt (about --system-tokens tokens: the start of this project's design document,
as a retrieval-augmented chat would send it) and a different user question (the held-out chat prompts), answered
greedily with the default model and drafter in the engine's default speculation mode, answers of --new-tokens
tokens on average (each request's length fixed, spread over half to one and a half times that, so that arrivals
spread as a chat server's do).
--concurrency requests are kept in flight over --requests requests (a finished one is replaced by the next). Two
engines, one with caching and one without, run alternately for --repeats rounds (the order flips every round);
each round starts from an empty cache, so its first request computes the system prompt. Reported per setting: TTFT
p50 and p90 over the round's requests, output tokens/s over the round, the drafter's mean acceptance length (tau:
tokens per speculative step) and the prompt tokens found in the cache; the median round of each, and the ratios of
caching to no caching. The default mode may draft in few steps at this load, so tau is also compared in one more
round per setting in which every step verifies 3 drafts (TAU_MODE).

    .venv/bin/python bench/prefix_cache.py       # writes bench/results/prefix_cache.{json,png}
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TAU_MODE = "fixed:3"


def system_prompt(tokenizer, n_tokens: int) -> str:
    text = (ROOT / "docs" / "design.md").read_text()
    ids = tokenizer(text, add_special_tokens=False).input_ids[:n_tokens]
    return "Answer the user's question. This document may help:\n\n" + tokenizer.decode(ids)


def answer_length(i: int, mean: int) -> int:
    """Request i's answer length: spread over [mean/2, 3 mean/2) as chat answers are, so that requests started
    together do not all finish, and their replacements all arrive, in the same step."""
    return mean // 2 + (i * 37) % mean


def run_round(engine, prompts: list[list[int]], conc: int, new_tokens: int, mode: str | None = None) -> dict:
    from engine import SamplingParams

    engine.reset_prefix_cache()
    spec = engine.speculator.counters
    drafts0, accepted0 = spec.drafts, spec.accepted_tokens
    stamp = time.monotonic_ns()
    queue = list(enumerate(prompts))

    def submit() -> None:
        i, p = queue.pop(0)
        engine.add_request(f"{stamp}-{i}", p, SamplingParams(max_tokens=answer_length(i, new_tokens), ignore_eos=True,
                                                             speculation=mode))

    t0 = time.perf_counter()
    for _ in range(min(conc, len(queue))):
        submit()
    done = []
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                done.append(o)
                if queue:
                    submit()
    seconds = time.perf_counter() - t0
    ttfts = sorted(o.metrics["ttft_s"] for o in done)
    drafts, accepted = spec.drafts - drafts0, spec.accepted_tokens - accepted0
    return {"ttft_p50_s": statistics.median(ttfts), "ttft_p90_s": ttfts[int(0.9 * (len(ttfts) - 1))],
            "tok_s": sum(len(o.token_ids) for o in done) / seconds, "seconds": seconds,
            "tau": 1 + accepted / max(drafts, 1), "spec_steps": drafts,
            "cached_share": sum(o.metrics["num_cached_tokens"] for o in done) / sum(len(o.prompt_token_ids)
                                                                                    for o in done)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--system-tokens", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--drafter", default="default")
    ap.add_argument("--name", default="prefix_cache")
    args = ap.parse_args()

    from draft_service.prompts import load_prompts
    from engine import EngineConfig, LLMEngine

    engines = {caching: LLMEngine(EngineConfig(drafter=args.drafter, enable_prefix_caching=caching,
                                               kv_cache_memory_gb=1.0))
               for caching in (True, False)}
    tok = engines[True].tokenizer
    system = system_prompt(tok, args.system_tokens)
    prompts = [list(tok.apply_chat_template([{"role": "system", "content": system}, *r["messages"]],
                                            add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
               for r in load_prompts("heldout")[:args.requests]]
    rounds = {True: [], False: []}
    for r in range(args.repeats):
        for caching in ((True, False) if r % 2 == 0 else (False, True)):
            rounds[caching].append(run_round(engines[caching], prompts, args.concurrency, args.new_tokens))
            res = rounds[caching][-1]
            print(f"round {r + 1} caching={caching}: TTFT p50 {1000 * res['ttft_p50_s']:.0f} ms, "
                  f"{res['tok_s']:.1f} tok/s, tau {res['tau']:.2f}, cached {res['cached_share']:.0%}", flush=True)
    # The default mode drafts only where it pays, which at this load may be few steps: the drafter's acceptance
    # is compared in one more round per setting where every step drafts and verifies 3 tokens.
    drafted = {caching: run_round(engines[caching], prompts, args.concurrency, args.new_tokens, mode=TAU_MODE)
               for caching in (True, False)}
    for caching, res in drafted.items():
        print(f"{TAU_MODE} caching={caching}: tau {res['tau']:.3f} over {res['spec_steps']} speculative steps")
    median = {c: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for c, rs in rounds.items()}
    on, off = median[True], median[False]
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "system_prompt_tokens": len(tok(system).input_ids),
        "mean_prompt_tokens": statistics.mean(map(len, prompts)), "concurrency": args.concurrency,
        "requests": args.requests, "new_tokens": args.new_tokens, "repeats": args.repeats,
        "dtype": str(engines[True].dtype).removeprefix("torch."), "speculation": engines[True].config.speculation
        or "adaptive", "caching": on, "no_caching": off, "rounds": {"caching": rounds[True], "no_caching": rounds[False]},
        "tau_mode": TAU_MODE, "tau_round": {"caching": drafted[True], "no_caching": drafted[False]},
        "ratios": {"ttft_p50": on["ttft_p50_s"] / off["ttft_p50_s"], "tok_s": on["tok_s"] / off["tok_s"],
                   "tau_delta": drafted[True]["tau"] - drafted[False]["tau"]},
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    plot(report, RESULTS / f"{args.name}.png")
    print(json.dumps({k: report[k] for k in ("caching", "no_caching", "ratios")}, indent=1))


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6))
    labels = ["no caching", "caching"]
    for ax, key, title, scale in ((axes[0], "ttft_p50_s", "TTFT p50 (ms)", 1000),
                                  (axes[1], "tok_s", "output tokens/s", 1),
                                  (axes[2], "tau", f"tau ({report['tau_mode']} round)", 1)):
        src = report["tau_round"] if key == "tau" else report
        values = [scale * src["no_caching"][key], scale * src["caching"][key]]
        ax.bar(labels, values, color=["#999999", "#3a7bd5"])
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:.0f}" if v >= 100 else f"{v:.3g}", ha="center", va="bottom")
        ax.set_title(title)
    fig.suptitle(f"{report['system_prompt_tokens']}-token shared system prompt, concurrency {report['concurrency']}, "
                 f"{report['requests']} requests x {report['new_tokens']} tokens ({report['date']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
