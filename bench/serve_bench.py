"""Serving benchmark over HTTP: TTFT, TPOT, ITL, throughput and goodput at concurrency 1, 4, 16 and 64 for
speculation `off` and `adaptive`, plus the HTTP path against the in-process engine and the draft actor against the
in-process drafter.

Load: held-out chat prompts (draft_service.prompts, split "heldout"), greedy, streamed (SSE) chat completions; at
concurrency C, C clients send requests back to back (each level: a bounded number of requests and a time limit; the
modes are interleaved per level so they see the same machine state).

Metrics per level (vLLM's benchmark definitions):
    TTFT   request sent -> first chunk with text                    (mean, p50, p90, p99)
    ITL    gap between consecutive text chunks (a chunk carries every token the step accepted)
    TPOT   (end-to-end - TTFT) / (output tokens - 1), per request
    throughput  output tokens / s and requests / s over the level's wall time
    goodput     requests / s meeting the SLO: TTFT < 2 s and TPOT < 200 ms (--slo-ttft-s, --slo-tpot-ms)
HTTP vs in-process (for each app layout, --ingress-modes): the same prompts and params through LLMEngine (same engine config, in-process drafter), one at a
time (latency) and all at once (throughput), and whether greedy texts match. Actor vs in-process drafter: the cost of
one draft round (sync one new tap row per sequence + propose) for B sequences, in-process, through the actor's
channel, and through a plain Ray actor call; each pair computes on the same core.

    .venv/bin/python bench/serve_bench.py            # starts a local Ray and the app on a free loopback port
    .venv/bin/python bench/serve_bench.py --url http://127.0.0.1:8000   # a running `dspark serve` (same --model)
    .venv/bin/python bench/serve_bench.py --quick    # concurrency 1 and 4, 32 new tokens, short levels
Writes bench/results/serve_bench[_quick].json and .png. Loopback only.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

RESULTS = Path(__file__).resolve().parent / "results"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


# ----- load generation ----------------------------------------------------------------------------------------


async def one_request(client, messages, max_tokens: int, mode: str) -> dict:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "speculation": mode}
    t0 = time.perf_counter()
    ttft, last, itls, text, usage, metrics, error = None, None, [], [], None, None, None
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return {"error": f"{r.status_code}: {(await r.aread())[:200]!r}"}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                error = chunk["error"]["message"]
                break
            now = time.perf_counter()
            piece = chunk["choices"][0]["delta"].get("content") if chunk.get("choices") else None
            if piece:
                if ttft is None:
                    ttft = now - t0
                else:
                    itls.append(now - last)
                last = now
                text.append(piece)
            usage = chunk.get("usage") or usage
            metrics = chunk.get("metrics") or metrics
    e2e = time.perf_counter() - t0
    if error or usage is None:
        return {"error": error or "no usage chunk"}
    n = usage["completion_tokens"]
    return {"ttft": ttft if ttft is not None else e2e, "e2e": e2e, "itls": itls, "tokens": n,
            "tpot": (e2e - (ttft or e2e)) / (n - 1) if n > 1 else 0.0, "text": "".join(text),
            "spec": (metrics or {}).get("speculative_decoding", {})}


async def run_level(url: str, prompts: list, concurrency: int, n_requests: int, max_tokens: int, mode: str,
                    time_limit_s: float) -> list[dict]:
    """`concurrency` clients send requests back to back until `n_requests` are sent or the time is up."""
    import httpx

    queue = list(range(n_requests))
    results: list[dict] = []
    deadline = time.monotonic() + time_limit_s
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=max(60.0, time_limit_s), limits=limits) as client:
        async def worker():
            while queue and time.monotonic() < deadline:
                i = queue.pop(0)
                try:
                    r = await one_request(client, prompts[i % len(prompts)], max_tokens, mode)
                except Exception as exc:  # a transport error counts as a failed request
                    r = {"error": repr(exc)}
                results.append({**r, "index": i})

        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        wall = time.perf_counter() - t0
    for r in results:
        r["wall"] = wall
    return results


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def summarize(results: list[dict], slo_ttft: float, slo_tpot: float) -> dict:
    ok = [r for r in results if "error" not in r]
    wall = results[0]["wall"] if results else float("nan")
    ttft = [r["ttft"] for r in ok]
    tpot = [r["tpot"] for r in ok if r["tokens"] > 1]
    itl = [x for r in ok for x in r["itls"]]
    good = [r for r in ok if r["ttft"] < slo_ttft and r["tpot"] < slo_tpot]
    steps = sum(r["spec"].get("num_spec_steps", 0) for r in ok)
    accepted = sum(r["spec"].get("num_accepted_tokens", 0) for r in ok)
    drafts = sum(r["spec"].get("num_draft_tokens", 0) for r in ok)

    def stats(xs):
        return {"mean": statistics.fmean(xs) if xs else float("nan"), "p50": pct(xs, 50), "p90": pct(xs, 90),
                "p99": pct(xs, 99)}

    return {
        "requests": len(results), "failed": len(results) - len(ok), "errors": [r["error"] for r in results
                                                                                if "error" in r][:3],
        "wall_s": wall, "ttft_s": stats(ttft), "tpot_s": stats(tpot), "itl_s": stats(itl),
        "output_tokens": sum(r["tokens"] for r in ok),
        "throughput_tok_s": sum(r["tokens"] for r in ok) / wall if ok else 0.0,
        "throughput_req_s": len(ok) / wall if ok else 0.0,
        "goodput_req_s": len(good) / wall if ok else 0.0, "slo_attainment": len(good) / max(len(results), 1),
        "mean_acceptance_length": 1 + accepted / steps if steps else 1.0,
        "acceptance_rate": accepted / drafts if drafts else 0.0, "num_spec_steps": steps,
    }


# ----- the server under test ----------------------------------------------------------------------------------


def start_local_app(engine_cfg, replicas: int, ingress_mode: str = "separate") -> tuple[str, callable]:
    """A local Ray + the app on a free loopback port (deployments.launch). Returns (base url, stop)."""
    from contextlib import ExitStack

    from deployments.config import LLMServingConfig
    from deployments.launch import local_serve, run_app

    config = LLMServingConfig(engine=engine_cfg, num_replicas=replicas, served_model_name="bench",
                              drafter_mode="actor" if engine_cfg.drafter else "none", ingress_mode=ingress_mode)
    cluster = ExitStack()
    port = cluster.enter_context(local_serve(num_cpus=max(4, os.cpu_count() or 1), object_store_mb=200))
    try:
        app = run_app(config, port, name="serve-bench")
    except BaseException:
        cluster.close()
        raise
    return app.base, cluster.close


def random_drafter(target_dir: Path, out: Path) -> Path:
    """A random-init drafter shaped like the trained default (1 layer, gamma 7, 16k draft vocabulary): for costs
    only, its drafts are never accepted."""
    import torch
    from transformers import AutoModelForCausalLM

    from draft_service.pipeline import DEFAULT_TAPS
    from draft_service.train import TrainConfig, build_drafter

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    layers = target.config.num_hidden_layers
    taps = DEFAULT_TAPS if max(DEFAULT_TAPS) < layers else sorted({layers * k // 5 for k in range(5)})
    vocab = torch.arange(min(16384, target.config.vocab_size))
    build_drafter(target, TrainConfig(init_from_target_layer=None, mask_token_id=0), taps, vocab).save_pretrained(out)
    return out


# ----- HTTP vs in-process ---------------------------------------------------------------------------------------


class InProcess:
    """The same requests through LLMEngine in this process (same engine config, in-process drafter)."""

    def __init__(self, engine_cfg, prompts: list, max_tokens: int, mode: str):
        from engine import LLMEngine, SamplingParams

        self.engine = LLMEngine(engine_cfg)
        tok = self.engine.tokenizer
        self.ids = [list(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"]) for m in prompts]
        self.params = SamplingParams(max_tokens=max_tokens, speculation=mode)

    def run(self, batch: list[tuple[int, list[int]]]) -> list:
        for i, p in batch:
            self.engine.add_request(f"b{i}-{time.monotonic_ns()}", p, self.params)
        outs = []
        while self.engine.has_unfinished_requests():
            outs += [o for o in self.engine.step() if o.finished]
        return outs

    def one_at_a_time(self) -> list:
        return [self.run([(i, p)])[0] for i, p in enumerate(self.ids)]

    def batch_tok_s(self) -> float:
        t0 = time.perf_counter()
        outs = self.run(list(enumerate(self.ids)))
        return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)


def http_vs_in_process(url: str, engine_cfg, prompts: list, max_tokens: int, mode: str, rounds: int) -> dict:
    """Latency one request at a time, then throughput with all prompts at once: HTTP and in-process batches
    alternate for `rounds` rounds (order flipped every round), and the ratio is the median of the per-round ratios,
    so that both sides of a ratio ran within seconds of each other on this shared machine."""
    local = InProcess(engine_cfg, prompts, max_tokens, mode)
    seq = asyncio.run(run_level(url, prompts, 1, len(prompts), max_tokens, mode, 600))
    local_seq = local.one_at_a_time()
    http_tok_s, local_tok_s = [], []
    for r in range(rounds):
        for side in (("http", "local") if r % 2 == 0 else ("local", "http")):
            if side == "http":
                batch = asyncio.run(run_level(url, prompts, len(prompts), len(prompts), max_tokens, mode, 600))
                http_tok_s.append(summarize(batch, 1e9, 1e9)["throughput_tok_s"])
            else:
                local_tok_s.append(local.batch_tok_s())
    ok = [r for r in seq if "error" not in r]
    http_texts = {r["index"]: r["text"] for r in ok}
    local_e2e = statistics.fmean(o.metrics["e2e_s"] for o in local_seq)
    return {
        "mode": mode, "requests": len(prompts), "rounds": rounds,
        "http": {"e2e_s": statistics.fmean(r["e2e"] for r in ok), "ttft_s": statistics.fmean(r["ttft"] for r in ok),
                 "batch_tok_s": http_tok_s},
        "in_process": {"e2e_s": local_e2e, "ttft_s": statistics.fmean(o.metrics["ttft_s"] for o in local_seq),
                       "batch_tok_s": local_tok_s, "drafter_error": local.engine.drafter_error,
                       "speculation": local.engine.speculator is not None},
        "batch_ratio": statistics.median(h / x for h, x in zip(http_tok_s, local_tok_s)),
        "http_overhead_ms": 1000 * (statistics.fmean(r["e2e"] for r in ok) - local_e2e),
        # Greedy texts should match; bf16 batch effects can flip a near-tie, so this is reported, not asserted.
        "greedy_text_match": sum(http_texts.get(i) == o.text for i, o in enumerate(local_seq)) / len(local_seq),
    }


# ----- draft actor vs in-process drafter --------------------------------------------------------------------------


def pin_all_threads(cores: set[int]) -> None:
    """Pins every thread of this process (sched_setaffinity with a thread id pins only that thread)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # the thread ended meanwhile
            pass


class RayCallDrafter:
    """The draft actor called the way it was before the channel: one Ray actor call per draft round."""

    def __init__(self, actor):
        self.actor = actor

    def step(self, syncs, work):
        import ray

        from draft_service.actor import pack_syncs

        return ray.get(self.actor.step.remote(*pack_syncs(syncs), work))[0]

    def release(self, keys):
        import ray

        ray.get(self.actor.release.remote(keys))


def _pin_actor(actor, cores: set[int]) -> None:  # run inside the actor by __ray_call__
    pin_all_threads(cores)


def actor_vs_in_process(target_dir: Path, drafter_dir: Path, dtype_name: str, batches: list[int], reps: int,
                        context: int = 128) -> dict:
    import ray
    import torch

    from draft_service.actor import DraftServiceProxy, load_target_head, start_draft_actor
    from draft_service.service import DraftService
    from engine.drafter import ContextSync, DraftWork
    from engine.loader import resolve_dtype

    dtype = resolve_dtype(dtype_name, torch.device("cpu"))
    dname = str(dtype).removeprefix("torch.")
    max_ctx = (context + 64) * max(batches) * 2
    embed, head = load_target_head(target_dir, dtype)
    local = DraftService.load(drafter_dir, embed, head, dtype, torch.device("cpu"), max_ctx)
    actor = start_draft_actor(str(drafter_dir), str(target_dir), dname, "cpu", max_ctx, num_cpus=1)
    remote = DraftServiceProxy(actor)
    width = len(local.tap_layers) * embed.shape[1]
    cores = sorted(os.sched_getaffinity(0))
    out = {"context_tokens": context, "cores": cores, "batches": {}}
    try:
        for b in batches:
            taps = torch.randn(context + 1, width).to(dtype)
            services = {"in_process": local, "actor": remote, "ray_call": RayCallDrafter(actor)}
            keys = {name: [f"{name}{i}" for i in range(b)] for name in services}
            times = {name: [] for name in services}
            inside = []  # the actor's own time in its service.step
            for name, svc in services.items():
                svc.step([ContextSync(k, 0, taps[:context]) for k in keys[name]], [])
            for rep in range(reps):  # one engine step: append the new token's taps, propose, roll back
                # Both drafters compute on the same core (the proxy waits on the other one), alternating cores:
                # the two vCPUs of this shared machine can differ in speed for minutes at a time.
                core, other = cores[rep % len(cores)], cores[(rep + 1) % len(cores)]
                ray.get(actor.__ray_call__.remote(_pin_actor, {core}))
                order = list(services) if rep % 2 == 0 else list(reversed(services))
                for name in order:
                    pin_all_threads({core} if name == "in_process" else {other})
                    t0 = time.perf_counter()
                    step = services[name].step([ContextSync(k, context, taps[context:]) for k in keys[name]],
                                               [DraftWork(k, 100, context + 1) for k in keys[name]])
                    times[name].append(time.perf_counter() - t0)
                    if name == "actor":
                        inside.append(step.seconds)
            pin_all_threads(set(cores))
            for name, svc in services.items():
                svc.release(keys[name])
            row = {f"{name}_ms": 1000 * statistics.median(ts) for name, ts in times.items()}
            # The rest of actor_ms is the transport: the channel's round trip and (un)packing.
            row["actor_compute_ms"] = 1000 * statistics.median(inside)
            row["overhead_ms"] = row["actor_ms"] - row["in_process_ms"]
            row["ratio"] = row["in_process_ms"] / row["actor_ms"]
            row["ray_call_ratio"] = row["in_process_ms"] / row["ray_call_ms"]
            out["batches"][str(b)] = row
    finally:
        pin_all_threads(set(cores))
        ray.kill(actor, no_restart=True)
    return out


# ----- main -------------------------------------------------------------------------------------------------------


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    panels = [("ttft_s", "p50", "TTFT p50 (s)"), ("tpot_s", "p50", "TPOT p50 (s)"), ("itl_s", "p50", "ITL p50 (s)"),
              ("throughput_tok_s", None, "output tokens/s"), ("goodput_req_s", None, "goodput (req/s within SLO)")]
    for ax, (key, sub, title) in zip(axes.flat, panels):
        for mode, levels in result["levels"].items():
            cs = sorted(int(c) for c in levels)
            ys = [levels[str(c)][key][sub] if sub else levels[str(c)][key] for c in cs]
            ax.plot(cs, ys, marker="o", label=mode)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    ax = axes.flat[5]
    av = result.get("actor_vs_in_process", {}).get("batches", {})
    if av:
        bs = sorted(int(b) for b in av)
        x = range(len(bs))
        bars = [("in_process_ms", "in-process drafter"), ("actor_ms", "draft actor (channel)"),
                ("ray_call_ms", "draft actor (a Ray call per round)")]
        for j, (key, label) in enumerate(bars):
            ax.bar([i + 0.27 * (j - 1) for i in x], [av[str(b)].get(key, 0) for b in bs], 0.27, label=label)
        ax.set_xticks(list(x), [str(b) for b in bs])
        ax.set_xlabel("sequences per draft round")
        ax.set_ylabel("ms per draft round")
        ax.set_title("draft round cost")
        ax.legend()
    fig.suptitle(f"serve_bench: {result['config']['model']} (SLO: TTFT < {result['slo']['ttft_s']} s, "
                 f"TPOT < {1000 * result['slo']['tpot_s']:.0f} ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default=None, help="a running server (loopback); default: start one here")
    ap.add_argument("--model", default=None)
    ap.add_argument("--drafter", default="default", help="'default', a folder, 'random' (cost only) or 'none'")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--kv-gb", type=float, default=1.0, help="KV cache per engine")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--concurrency", default=None, help="comma list (default 1,4,16,64; quick 1,4)")
    ap.add_argument("--modes", default="off,adaptive")
    ap.add_argument("--max-tokens", type=int, default=None, help="default 128 (quick 32)")
    ap.add_argument("--requests", type=int, default=None, help="per level (default max(8, 3 x C); quick 2 x C)")
    ap.add_argument("--level-time-s", type=float, default=None, help="per level (default 180; quick 60)")
    ap.add_argument("--slo-ttft-s", type=float, default=2.0)
    ap.add_argument("--slo-tpot-ms", type=float, default=200.0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of the in-process runs: the replica's and the actor's (num_cpus 1 each)")
    ap.add_argument("--ingress-modes", default="separate,in_replica",
                    help="the app layouts compared with the in-process engine (ingress_mode); the load levels use "
                         "the first")
    ap.add_argument("--skip-levels", action="store_true", help="only the HTTP / in-process and actor comparisons")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)  # same as the serving processes, so the comparisons are like for like

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from draft_service.prompts import load_prompts
    from engine.config import EngineConfig
    from engine.loader import resolve_model

    q = args.quick
    conc = [int(c) for c in (args.concurrency or ("1,4" if q else "1,4,16,64")).split(",")]
    modes = args.modes.split(",")
    ingress_modes = args.ingress_modes.split(",")
    max_tokens = args.max_tokens or (32 if q else 128)
    level_time = args.level_time_s or (60.0 if q else 180.0)
    prompts = [r["messages"] for r in load_prompts("heldout")]
    target_dir = resolve_model(args.model)
    tmp = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    drafter = args.drafter
    if drafter == "random":
        drafter = str(random_drafter(target_dir, tmp / "drafter"))
    engine_cfg = EngineConfig(model=args.model, dtype=args.dtype, kv_cache_memory_gb=args.kv_gb,
                              drafter=None if drafter == "none" else drafter)

    stop = None
    url = args.url
    if url:
        if urlparse(url).hostname not in LOOPBACK:
            raise SystemExit("serve_bench only talks to loopback servers")
    else:
        url, stop = start_local_app(engine_cfg, args.replicas, ingress_modes[0])
    import httpx

    info = httpx.get(f"{url}/stats", timeout=30).json()
    result = {"config": {"model": args.model or "SmolLM2-135M-Instruct", "drafter": args.drafter, "dtype": args.dtype,
                         "max_tokens": max_tokens, "concurrency": conc, "modes": modes, "quick": q,
                         "replicas": args.replicas, "url": url, "cpus": os.cpu_count(), "threads": args.threads},
              "slo": {"ttft_s": args.slo_ttft_s, "tpot_s": args.slo_tpot_ms / 1000},
              "server": {"drafter_error": info.get("drafter_error"),
                         "speculation": bool(info.get("speculation"))},
              "levels": {m: {} for m in modes}}
    try:
        for c in [] if args.skip_levels else conc:
            n = args.requests or (2 * c if q else max(8, 3 * c))
            for mode in modes:
                t0 = time.perf_counter()
                res = asyncio.run(run_level(url, prompts, c, n, max_tokens, mode, level_time))
                s = summarize(res, args.slo_ttft_s, args.slo_tpot_ms / 1000)
                result["levels"][mode][str(c)] = s
                print(f"C={c:<3} {mode:<9} {s['requests']:>3} req ({s['failed']} failed)"
                      f" in {time.perf_counter() - t0:5.1f} s"
                      f"  TTFT p50 {s['ttft_s']['p50']:.3f} s  TPOT p50 {1000 * s['tpot_s']['p50']:.1f} ms"
                      f"  {s['throughput_tok_s']:.1f} tok/s  goodput {s['goodput_req_s']:.2f} req/s"
                      f"  accept len {s['mean_acceptance_length']:.2f}", flush=True)
        k = 4 if q else 16  # the goal is stated at concurrency 16
        result["http_vs_in_process"] = {}
        for i, layout in enumerate(ingress_modes if stop else ingress_modes[:1]):
            if i:  # the next layout on a fresh local Ray
                stop()
                url, stop = start_local_app(engine_cfg, args.replicas, layout)
            r = http_vs_in_process(url, engine_cfg, prompts[:k], max_tokens, "adaptive", 2 if q else 6)
            result["http_vs_in_process"][layout] = r
            print(f"HTTP ({layout}) vs in-process:", json.dumps(r), flush=True)
    finally:
        if stop:
            stop()
    try:
        from engine.loader import resolve_drafter
        from transformers import AutoConfig

        cost_drafter, note = drafter, "the served drafter"
        try:
            cost_drafter = str(resolve_drafter(drafter, AutoConfig.from_pretrained(target_dir)))
        except (OSError, ValueError, TypeError):
            cost_drafter, note = str(random_drafter(target_dir, tmp / "cost-drafter")), "random weights (cost only)"
        import ray

        ray.init(address="local", num_cpus=2, object_store_memory=100 * 2**20, include_dashboard=False,
                 log_to_driver=False)
        try:
            av = actor_vs_in_process(target_dir, Path(cost_drafter), args.dtype, [1, 4] if q else [1, 4, 16, 64],
                                     5 if q else 20)
        finally:
            ray.shutdown()
        av["drafter"] = note
        result["actor_vs_in_process"] = av
        print("draft round, actor vs in-process:", json.dumps(av["batches"]), flush=True)
    except Exception as exc:  # the load results still get written
        result["actor_vs_in_process"] = {"error": repr(exc)}
        print("actor vs in-process failed:", repr(exc), flush=True)

    out = Path(args.out) if args.out else RESULTS / ("serve_bench_quick" if q else "serve_bench")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    plot(result, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
