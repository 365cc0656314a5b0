"""Decode throughput of the engine against transformers, and against the model's linear layers alone.

For each dtype (float32, bfloat16) and concurrency (1, 4, 16, 64), on the same held-out chat prompts:
- engine: decode tokens/s and median step time of LLMEngine (prefill excluded: timing starts once every request
  has its first token), with nothing run between steps;
- limit: the model's linear layers alone (the engine's own prepacked Linear objects, same weights and dtype) at the
  same number of tokens per step, timed between every 4th pair of engine steps (median) in a second pass over the
  same prompts, so that both see the same state of this shared machine; step / linear is that pass's median step
  over the floor. An engine step can hardly beat the floor; the gap is the engine's overhead;
- hf_generate: transformers `generate` with a static, left-padded batch;
- hf_generate_batch: transformers' own continuous batching (`generate_batch`).
Decode rates of the transformers paths are (N*M - N*1) tokens over t(M) - t(1), so prefill is excluded there too.
Each system runs in its own subprocess, so its peak RSS is its own.

    .venv/bin/python bench/engine_throughput.py            # writes bench/results/engine_throughput.{json,png}
    .venv/bin/python bench/engine_throughput.py --quick    # fewer tokens, to check it runs
    .venv/bin/python bench/engine_throughput.py --name engine_throughput_avx512   # another results file
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import resource
import time
from statistics import median
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CONCURRENCY = [1, 4, 16, 64]
DTYPES = ["float32", "bfloat16"]


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    from draft_service.prompts import load_prompts

    prompts = load_prompts("heldout")[:n]
    return [list(tokenizer.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=True,
                                               return_dict=True)["input_ids"]) for p in prompts]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_engine(dtype: str, new_tokens: int) -> dict:
    import torch

    from engine import EngineConfig, LLMEngine, SamplingParams

    # KV cache sized for this load (64 x ~200 tokens), so peak RSS is not the default 2 GiB budget.
    engine = LLMEngine(EngineConfig(dtype=dtype, device="cpu", max_num_seqs=64, max_num_batched_tokens=4096,
                                    kv_cache_memory_gb=0.5))
    prompts = chat_prompts(engine.tokenizer, max(CONCURRENCY))
    # Warm-up, as the transformers paths get (their 1-token runs): oneDNN builds a kernel per new batch shape on
    # first use, which took the mean decode step at concurrency 1 from 10 to 17 ms when left in the timed run.
    for conc in CONCURRENCY:
        for i, p in enumerate(prompts[:conc]):
            engine.add_request(f"warm{conc}-{i}", p, SamplingParams(max_tokens=4, ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
    out = {}
    for conc in CONCURRENCY:
        # Two passes over the same prompts. Throughput is timed with nothing between steps, as the transformers
        # paths are; the step / floor ratio comes from a second pass that times the floor between steps, since
        # the floor disturbs the step after it (a 1-sequence step: 8-9 ms alone, 10.3 ms median interleaved).
        tok_s, alone = decode_pass(engine, prompts[:conc], f"t{conc}", new_tokens)
        _, paired = decode_pass(engine, prompts[:conc], f"p{conc}", new_tokens,
                                between=lambda rows=conc: linear_only_ms(engine, rows, torch, reps=1))
        out[conc] = {"tok_s": tok_s, "step_ms": 1000 * median(t for t, _ in paired),
                     "linear_ms": median(f for _, f in paired if f is not None),
                     "step_ms_alone": 1000 * median(t for t, _ in alone)}
    return {"results": out, "peak_rss_mb": peak_rss_mb()}


def decode_pass(engine, prompts, tag: str, new_tokens: int, between=None) -> tuple[float, list]:
    """Decode `prompts` together to `new_tokens` each, timing steps once every request has its first token.
    `between`, if given, runs between every 4th pair of steps (not timed into tok/s). Returns decode tokens/s and
    [(step seconds, what `between` returned after it or None)]."""
    from engine import SamplingParams

    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts):
        engine.add_request(rid, p, SamplingParams(max_tokens=new_tokens, ignore_eos=True))
    seqs = [engine.requests[r] for r in ids]
    while any(s.num_output_tokens == 0 for s in seqs):
        engine.step()
    steps, tokens = [], 0
    while engine.has_unfinished_requests():
        ts = time.perf_counter()
        outs = engine.step()
        seconds = time.perf_counter() - ts
        tokens += sum(len(o.new_token_ids) for o in outs)
        steps.append((seconds, between() if between and len(steps) % 4 == 3 else None))
    return tokens / sum(t for t, _ in steps), steps


def linear_only_ms(engine, tokens: int, torch, reps: int = 20) -> float:
    """The model's linear layers alone, in forward order, at `tokens` rows: the floor of a decode step."""
    m = engine.model
    lins = [lin for layer in m.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)] + [m.lm_head]
    xs = {}
    for lin in lins:
        xs.setdefault(lin.in_features, torch.randn(tokens, lin.in_features, dtype=m.dtype))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for lin in lins:
            lin(xs[lin.in_features])
        times.append(time.perf_counter() - t0)
    return 1000 * sorted(times)[reps // 2]


def run_hf(dtype: str, new_tokens: int, continuous: bool) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from engine.loader import resolve_model

    path = resolve_model(None)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    prompts = chat_prompts(tok, max(CONCURRENCY))
    out = {}
    for conc in CONCURRENCY:
        batch = prompts[:conc]

        def timed(n_new: int) -> float:
            gen = GenerationConfig(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, pad_token_id=0,
                                   eos_token_id=None)
            t0 = time.perf_counter()
            with torch.inference_mode():
                if continuous:
                    model.generate_batch(inputs=batch, generation_config=gen, progress_bar=False)
                else:
                    width = max(len(p) for p in batch)
                    ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
                    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
                    model.generate(ids, attention_mask=mask, generation_config=gen)
            return time.perf_counter() - t0

        t1 = min(timed(1) for _ in range(2))
        tm = timed(new_tokens)
        out[conc] = {"tok_s": conc * (new_tokens - 1) / max(tm - t1, 1e-9)}
    return {"results": out, "peak_rss_mb": peak_rss_mb()}


def _child(target, args, queue):
    try:
        queue.put(target(*args))
    except Exception as exc:  # report, don't hang the parent
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def in_subprocess(target, *args) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(target, args, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for dtype, style in zip(DTYPES, ("--", "-")):
        if dtype not in report:
            continue
        for system, color in (("engine", "C0"), ("hf_generate", "C1"), ("hf_generate_batch", "C2")):
            res = report[dtype].get(system, {}).get("results")
            if res:
                axes[0].plot(CONCURRENCY, [res[str(c)]["tok_s"] for c in CONCURRENCY], style, color=color,
                             marker="o", label=f"{system} {dtype}")
        eng = report[dtype]["engine"]["results"]
        axes[1].plot(CONCURRENCY, [eng[str(c)]["step_ms"] for c in CONCURRENCY], style, marker="o", color="C0",
                     label=f"engine step {dtype}")
        axes[1].plot(CONCURRENCY, [eng[str(c)]["linear_ms"] for c in CONCURRENCY], style, marker="s", color="C3",
                     label=f"linear layers only {dtype}")
        axes[2].plot(CONCURRENCY, [eng[str(c)]["step_ms"] / eng[str(c)]["linear_ms"] for c in CONCURRENCY], style,
                     marker="o", label=dtype)
    axes[2].axhline(1.3, color="gray", lw=0.8, ls=":", label="goal 1.3x")
    for ax, title, ylabel in zip(axes, ("decode throughput", "decode step vs its linear layers", "step / linear"),
                                 ("tokens/s", "ms", "ratio")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(CONCURRENCY, [str(c) for c in CONCURRENCY])
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=7)
    axes[0].set_yscale("log")
    fig.suptitle("SmolLM2-135M-Instruct decode on this CPU (" + report["machine"] + ")")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def machine() -> str:
    """The CPU, its core count and whether it has AVX-512 / AVX512-BF16 (what the kernels and dtype "auto" use)."""
    from engine.ops import cpu_flags

    model, flags = platform.processor() or platform.machine(), cpu_flags()
    try:
        info = Path("/proc/cpuinfo").read_text()
        model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), model)
    except OSError:
        pass
    isa = "avx512_bf16" if "avx512_bf16" in flags else "avx512f" if "avx512f" in flags else \
        "avx2" if "avx2" in flags else "no avx2"
    return f"{model}, {mp.cpu_count()} cores, {isa}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="16 new tokens, to check the script")
    ap.add_argument("--skip-hf-batch", action="store_true")
    ap.add_argument("--name", default="engine_throughput", help="results file stem under bench/results/")
    ap.add_argument("--dtypes", default=",".join(DTYPES),
                    help="comma-separated; a CPU without AVX512-BF16 runs bf16 matmuls several times slower than fp32")
    args = ap.parse_args()
    n = 16 if args.quick else args.new_tokens
    report = {"new_tokens": n, "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M")}
    for dtype in args.dtypes.split(","):
        report[dtype] = {}
        for system, target, extra in (("engine", run_engine, ()), ("hf_generate", run_hf, (False,)),
                                      ("hf_generate_batch", run_hf, (True,))):
            if system == "hf_generate_batch" and args.skip_hf_batch:
                continue
            print(f"{dtype} {system} ...", flush=True)
            res = in_subprocess(target, dtype, n, *extra)
            res.setdefault("results", {})
            res["results"] = {str(k): v for k, v in res["results"].items()}
            report[dtype][system] = res
            print(json.dumps(res), flush=True)
    RESULTS.mkdir(exist_ok=True)
    name = args.name + ("_quick" if args.quick else "")
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=1))
    plot(report, RESULTS / f"{name}.png")
    print_table(report)


def print_table(report: dict) -> None:
    print("| dtype | conc | engine tok/s | step ms alone | step ms | linear-only ms | step/linear | HF generate tok/s "
          "| x HF | HF generate_batch tok/s | peak RSS MB (engine / HF) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for dtype in (d for d in DTYPES if d in report):
        eng = report[dtype]["engine"]
        hf = report[dtype].get("hf_generate", {})
        hfb = report[dtype].get("hf_generate_batch", {})
        for c in map(str, CONCURRENCY):
            e = eng["results"][c]
            h = hf.get("results", {}).get(c, {}).get("tok_s")
            hb = hfb.get("results", {}).get(c, {}).get("tok_s")
            hf_tok = f"{h:.0f}" if h else "-"
            speedup = f"{e['tok_s'] / h:.1f}" if h else "-"
            hfb_tok = f"{hb:.0f}" if hb else "-"
            print(f"| {dtype} | {c} | {e['tok_s']:.0f} | {e.get('step_ms_alone', float('nan')):.1f} | "
                  f"{e['step_ms']:.1f} | {e['linear_ms']:.1f} | "
                  f"{e['step_ms'] / e['linear_ms']:.2f} | {hf_tok} | {speedup} | {hfb_tok} | "
                  f"{eng['peak_rss_mb']:.0f} / {hf.get('peak_rss_mb', 0):.0f} |")


if __name__ == "__main__":
    main()
