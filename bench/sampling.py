"""Sampling cost: inverse-CDF sampling (engine/sampler.py) against the exponential race it replaced, in one run.

1. `sample()` alone on random bf16 logits over the default model's vocabulary, T=1.0, 1/16/64 rows, seeded or not.
2. The engine end to end: 64 seeded T=1.0 requests on the hard prompts, speculation off, 96 new tokens, the two
   samplers interleaved (A/B/A/B).

    .venv/bin/python bench/sampling.py      # writes bench/results/sampling.{json,png}
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def exponential_race(probs, generators, default):
    """The replaced sampler: argmax of p / E, E ~ Exp(1), a noise value per vocabulary entry."""
    noise = torch.empty(tuple(probs.shape), device=probs.device).exponential_(generator=default)
    for i, g in enumerate(generators):
        if g is not None:
            noise[i].exponential_(generator=g)
    return (probs / noise.clamp_(min=1e-20)).argmax(dim=1)


def main() -> None:
    import engine.sampler as sampler
    from engine import EngineConfig, LLMEngine, SamplingParams

    methods = {"inverse_cdf": sampler.sample_from_probs, "exponential_race": exponential_race}
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "sample_ms": {}, "engine_tok_s": {m: [] for m in methods}}
    vocab = 49152
    for n in (1, 16, 64):
        logits = torch.randn(n, vocab, dtype=torch.bfloat16)
        for seeded in (False, True):
            batch = sampler.SamplingBatch.build([SamplingParams(temperature=1.0)] * n,
                                                [torch.Generator().manual_seed(i) if seeded else None
                                                 for i in range(n)], torch.device("cpu"))
            for name, fn in methods.items():
                sampler.sample_from_probs = fn
                sampler.sample(logits, batch)
                t0 = time.perf_counter()
                for _ in range(10):
                    sampler.sample(logits, batch)
                ms = (time.perf_counter() - t0) * 100
                report["sample_ms"][f"{name}/{n}/{'seeded' if seeded else 'unseeded'}"] = ms
                print(f"sample() {name:16s} rows {n:2d} {'seeded' if seeded else 'unseeded':8s} {ms:7.1f} ms",
                      flush=True)

    from spec_decode import run_cell  # run as a script, bench/ is on the path

    from draft_service.prompts import load_prompts

    engine = LLMEngine(EngineConfig(drafter="default", max_num_seqs=64, max_num_batched_tokens=2048,
                                    kv_cache_memory_gb=1.0))
    prompts = [list(engine.tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=True,
                                                         return_dict=True)["input_ids"])
               for r in load_prompts("hard")[:64]]
    run_cell(engine, prompts[:4], "off", 1.0, 16, 0)  # warm-up
    for rnd in range(2):
        for name, fn in methods.items():
            sampler.sample_from_probs = fn
            tok_s = run_cell(engine, prompts, "off", 1.0, 96, seed=64)["tok_s"]
            report["engine_tok_s"][name].append(tok_s)
            print(f"engine round {rnd} {name:16s} {tok_s:7.1f} tok/s", flush=True)
    sampler.sample_from_probs = methods["inverse_cdf"]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sampling.json").write_text(json.dumps(report, indent=1))
    plot(report, RESULTS / "sampling.png")


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    keys = [k for k in report["sample_ms"] if k.startswith("inverse_cdf/")]
    labels = [k.split("/", 1)[1] for k in keys]
    x = range(len(keys))
    a.bar([i - 0.2 for i in x], [report["sample_ms"]["exponential_race/" + k] for k in labels], 0.4,
          label="exponential race")
    a.bar([i + 0.2 for i in x], [report["sample_ms"]["inverse_cdf/" + k] for k in labels], 0.4, label="inverse CDF")
    a.set_xticks(list(x), labels, rotation=20, fontsize=8)
    a.set_ylabel("ms per sample() call")
    a.set_title("sample(), T=1.0, 49k vocabulary")
    a.legend()
    names = list(report["engine_tok_s"])
    b.bar(names, [sum(v) / len(v) for v in report["engine_tok_s"].values()])
    b.set_ylabel("output tokens/s")
    b.set_title("engine: 64 seeded T=1.0 requests, speculation off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
