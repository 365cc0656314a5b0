"""The server measured by an outside load client, GuideLLM (vLLM's own benchmarking tool, from PyPI), beside ours
(bench/serve_bench.py's client), on the same requests, in one run.

Why GuideLLM: it is the load generator the vLLM project ships and documents for OpenAI-compatible servers, it
installs from PyPI with no GPU, and it reports the figures our client reports (TTFT, ITL, output tokens/s) by its own
definitions. It lives in its own virtual environment (its pins differ from Ray Serve's): --guidellm names its
executable; without one, the script makes bench/.guidellm-venv (torch first, from the local CPU wheel).

Workload: the held-out chat prompts (their user turn), greedy (so both clients get the same answers), streamed chat
completions of at most --new-tokens tokens, at concurrency 1, 4 and 16 (closed loop: each client sends its next request when one ends),
--requests-per-stream requests per concurrent stream, the default model and drafter in the default speculation
mode, one replica started as `dspark serve` starts it. At each level the two clients alternate for --rounds rounds
(the order flips each round), and each figure is the median round.

    .venv/bin/python bench/outside_client.py      # writes bench/results/outside_client.{json,png}
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
RESULTS = ROOT / "bench" / "results"
GUIDELLM_VERSION = "0.8.1"
MODEL_NAME = "bench"  # serve_bench.start_local_app's served model name


def guidellm_executable(path: str | None) -> str:
    if path:
        return path
    venv = ROOT / "bench" / ".guidellm-venv"
    exe = venv / "bin" / "guidellm"
    if not exe.exists():
        pip = [str(venv / "bin" / "python"), "-m", "pip", "-q", "--disable-pip-version-check", "install"]
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(pip + ["torch==2.13.0"], check=True)  # the local CPU wheel, before anything asks for torch
        subprocess.run(pip + [f"guidellm=={GUIDELLM_VERSION}"], check=True)
    return str(exe)


def user_turns(n: int) -> list[str]:
    from draft_service.prompts import load_prompts

    out = []
    for record in load_prompts("heldout"):
        users = [m["content"] for m in record["messages"] if m["role"] == "user"]
        if users:
            out.append(users[-1])
    return out[:n]


def run_guidellm(exe: str, url: str, tokenizer_dir: str, prompts_file: Path, streams: int, requests: int,
                 new_tokens: int, out: Path) -> dict:
    """One GuideLLM benchmark at `streams` concurrent streams; returns our summary of its report."""
    scenario = {
        "spec": {
            "backend": {"kind": "openai_http", "target": url, "model": MODEL_NAME,
                        "request_format": "/v1/chat/completions", "max_tokens": new_tokens,
                        "extras": {"body": {"temperature": 0}}},
            "profile": {"kind": "concurrent", "streams": streams},
            "tokenizer": {"kind": "huggingface_auto", "model": tokenizer_dir},
            "data": [{"kind": "json_file", "path": str(prompts_file)}],
            "constraints": [{"kind": "max_requests", "count": requests}],
            "outputs": [{"kind": "json", "path": str(out)}],
        },
    }
    scenario_file = out.with_suffix(".scenario.json")
    scenario_file.write_text(json.dumps(scenario))
    t0 = time.perf_counter()
    proc = subprocess.run([exe, "run", "--scenario", str(scenario_file), "--disable-console-interactive"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"guidellm failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return summarize_guidellm(json.loads(out.read_text()), time.perf_counter() - t0)


def summarize_guidellm(report: dict, wall_s: float) -> dict:
    bench = report["benchmarks"][0]
    metrics = bench["metrics"]

    def stat(name: str, key: str, scale: float = 1.0) -> float:
        return metrics[name]["successful"][key] * scale

    return {"ttft_p50_s": stat("time_to_first_token_ms", "median", 1e-3),
            "itl_p50_s": stat("inter_token_latency_ms", "median", 1e-3),
            "tok_s": stat("output_tokens_per_second", "mean"),
            "requests": metrics["request_totals"]["successful"], "failed": metrics["request_totals"]["errored"],
            "wall_s": wall_s}


def run_ours(url: str, prompts: list[str], streams: int, requests: int, new_tokens: int) -> dict:
    from serve_bench import run_level, summarize

    messages = [[{"role": "user", "content": p}] for p in prompts]
    results = asyncio.run(run_level(url, messages, streams, requests, new_tokens, mode=None, time_limit_s=600))
    s = summarize(results, slo_ttft=2.0, slo_tpot=0.2)
    return {"ttft_p50_s": s["ttft_s"]["p50"], "itl_p50_s": s["itl_s"]["p50"], "tok_s": s["throughput_tok_s"],
            "requests": s["requests"] - s["failed"], "failed": s["failed"], "wall_s": s["wall_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--guidellm", default=None, help="a guidellm executable (default: make bench/.guidellm-venv)")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--requests-per-stream", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--name", default="outside_client")
    args = ap.parse_args()
    exe = guidellm_executable(args.guidellm)
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()

    from engine import EngineConfig
    from engine.loader import resolve_model
    from serve_bench import start_local_app

    levels = [int(c) for c in args.concurrency.split(",")]
    prompts = user_turns(max(levels) * args.requests_per_stream)
    url, stop = start_local_app(EngineConfig(drafter="default"), replicas=1)
    rows = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            prompts_file = Path(tmp) / "prompts.jsonl"
            prompts_file.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
            run_ours(url, prompts, 1, 2, 8)  # warm-up: first requests compile and fill caches
            for c in levels:
                n = c * args.requests_per_stream
                rounds = {"ours": [], "guidellm": []}
                for r in range(args.rounds):
                    for client in (("ours", "guidellm") if r % 2 == 0 else ("guidellm", "ours")):
                        if client == "ours":
                            res = run_ours(url, prompts[:n], c, n, args.new_tokens)
                        else:
                            res = run_guidellm(exe, url, str(resolve_model(None)), prompts_file, c, n,
                                               args.new_tokens, Path(tmp) / f"g{c}-{r}.json")
                        rounds[client].append(res)
                        print(f"c={c} round {r + 1} {client}: {res['tok_s']:.1f} tok/s, TTFT p50 "
                              f"{1000 * res['ttft_p50_s']:.0f} ms, ITL p50 {1000 * res['itl_p50_s']:.0f} ms, "
                              f"{res['requests']} ok, {res['failed']} failed", flush=True)
                med = {k: {m: statistics.median(x[m] for x in v) for m in v[0]} for k, v in rounds.items()}
                rows[c] = {**med, "rounds": rounds,
                           "ratio_tok_s": med["guidellm"]["tok_s"] / med["ours"]["tok_s"],
                           "ratio_ttft_p50": med["guidellm"]["ttft_p50_s"] / med["ours"]["ttft_p50_s"]}
    finally:
        stop()
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "guidellm": version, "new_tokens": args.new_tokens,
              "requests_per_stream": args.requests_per_stream, "rounds": args.rounds, "levels": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    plot(report, RESULTS / f"{args.name}.png")
    for c, row in rows.items():
        print(f"c={c}: tok/s ours {row['ours']['tok_s']:.1f} guidellm {row['guidellm']['tok_s']:.1f} "
              f"({row['ratio_tok_s']:.2f}x); TTFT p50 ours {1000 * row['ours']['ttft_p50_s']:.0f} ms guidellm "
              f"{1000 * row['guidellm']['ttft_p50_s']:.0f} ms")


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = list(report["levels"])
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, key, title, scale in ((axes[0], "tok_s", "output tokens/s", 1), (axes[1], "ttft_p50_s", "TTFT p50 (ms)",
                                                                             1000),
                                  (axes[2], "itl_p50_s", "ITL p50 (ms)", 1000)):
        x = range(len(levels))
        for dx, client, color in ((-0.2, "ours", "#3a7bd5"), (0.2, "guidellm", "#e08a2c")):
            ax.bar([i + dx for i in x], [scale * report["levels"][c][client][key] for c in levels], width=0.4,
                   label="bench/serve_bench.py's client" if client == "ours" else f"GuideLLM {report['guidellm']}",
                   color=color)
        ax.set_xticks(list(x), [f"c={c}" for c in levels])
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"one replica, default model and drafter, {report['new_tokens']} tokens per request "
                 f"({report['date']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
