"""Serving benchmark over HTTP: TTFT, TPOT, ITL, throughput and goodput at concurrency 1, 4, 16 and 64 for
speculation `off` and the default mode (`adaptive+lookup`), plus the HTTP path against the in-process engine and the
draft actor against the in-process drafter.

Load: held-out chat prompts (draft_service.prompts, split "heldout"), greedy, streamed (SSE) chat completions; at
concurrency C, C clients send requests back to back (each level: a bounded number of requests and a time limit; the
modes are interleaved per level so they see the same machine state).

Metrics per level (vLLM's benchmark definitions):
    TTFT   request sent -> first chunk with text                    (mean, p50, p90, p99)
    ITL    gap between consecutive text chunks (a chunk carries every token the step accepted)
    TPOT   (end-to-end - TTFT) / (output tokens - 1), per request
    throughput  output tokens / s and requests / s over the level's wall time
    goodput     requests / s meeting the SLO: TTFT < 2 s and TPOT < 200 ms (--slo-ttft-s, --slo-tpot-ms)
HTTP vs in process, at every level: the same prompts, params and closed loop through LLMEngine in this process
(same engine config, in-process drafter, every core), alternating with the HTTP level for --rounds rounds; the ratio
of tokens/s, the TTFT p50 gap, each side's mean engine step, whether greedy texts match, and the HTTP level's CPU time
per kind of process (engine, replica, proxy, ingress, draft actor, Ray, this client). The local app is sized and
fronted as `dspark serve` does it (deployments.cli.single_machine_sizing; HAProxy, or --http-proxy ray for Serve's
Python proxy); --set changes any serving config field.
Actor vs in-process drafter: the cost of
one draft round (sync one new tap row per sequence + propose) for B sequences, in-process, through the actor's
channel, and through a plain Ray actor call; each pair computes on the same core.

    .venv/bin/python bench/serve_bench.py            # starts a local Ray and the app on a free loopback port
    .venv/bin/python bench/serve_bench.py --url http://127.0.0.1:8000   # a running `dspark serve` (same --model)
    .venv/bin/python bench/serve_bench.py --quick    # concurrency 1 and 4, 32 new tokens, short levels
    .venv/bin/python bench/serve_bench.py --concurrency 64 --modes off --set torch_threads=1   # one variant
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


def start_local_app(engine_cfg, replicas: int, ingress_mode: str = "in_replica",
                    overrides: dict | None = None, http_proxy: str = "haproxy") -> tuple[str, callable]:
    """A local Ray + the app on a free loopback port (deployments.launch), sized as `dspark serve` sizes it on this
    machine. `overrides`: serving config fields (nested dicts). Returns (base url, stop)."""
    from contextlib import ExitStack

    from deployments.config import LLMServingConfig
    from deployments.launch import local_serve, run_app

    from deployments.cli import single_machine_sizing

    fields = {"engine": engine_cfg.model_dump(), "num_replicas": replicas, "served_model_name": "bench",
              "drafter_mode": "actor" if engine_cfg.drafter else "none", "ingress_mode": ingress_mode,
              **single_machine_sizing(replicas)}
    for key, value in (overrides or {}).items():
        fields[key] = {**fields.get(key, {}), **value} if isinstance(value, dict) else value
    config = LLMServingConfig.model_validate(fields)
    cluster = ExitStack()
    port = cluster.enter_context(local_serve(num_cpus=max(4, os.cpu_count() or 1), object_store_mb=200,
                                             http_proxy=http_proxy))
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


# ----- HTTP vs in-process, per level ------------------------------------------------------------------------------


class InProcess:
    """The same requests through LLMEngine in this process (same engine config, in-process drafter), driven the way
    the HTTP clients drive the server: `concurrency` requests in flight, the next one added when one finishes."""

    def __init__(self, engine_cfg, prompts: list):
        from engine import LLMEngine

        self.engine = LLMEngine(engine_cfg)
        tok = self.engine.tokenizer
        self.ids = [list(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"]) for m in prompts]

    def level(self, concurrency: int, n_requests: int, max_tokens: int, mode: str) -> list[dict]:
        from engine import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, speculation=mode)
        engine, pending, live, results = self.engine, list(range(n_requests)), {}, []

        def admit():
            i = pending.pop(0)
            rid = f"ip{i}-{time.monotonic_ns()}"
            live[rid] = {"index": i, "t0": time.perf_counter(), "ttft": None, "last": None, "itls": []}
            engine.add_request(rid, self.ids[i % len(self.ids)], params)

        t0 = time.perf_counter()
        while pending and len(live) < concurrency:
            admit()
        while live:
            outs = engine.step()
            now = time.perf_counter()
            for o in outs:
                r = live[o.request_id]
                if o.new_text:  # as the HTTP client: time to the first text, then between texts
                    if r["ttft"] is None:
                        r["ttft"] = now - r["t0"]
                    else:
                        r["itls"].append(now - r["last"])
                    r["last"] = now
                if o.finished:
                    del live[o.request_id]
                    n, e2e = len(o.token_ids), now - r["t0"]
                    ttft = r["ttft"] if r["ttft"] is not None else e2e
                    results.append({"index": r["index"], "ttft": ttft, "e2e": e2e, "itls": r["itls"], "tokens": n,
                                    "tpot": (e2e - ttft) / (n - 1) if n > 1 else 0.0, "text": o.text,
                                    "spec": o.metrics.get("speculative_decoding", {})})
                    if pending:
                        admit()
        wall = time.perf_counter() - t0
        for r in results:
            r["wall"] = wall
        return results

    def step_counters(self) -> dict:
        c = self.engine.counters
        return {"steps": c.steps, "step_time_s": c.step_time_s}


def _label(proc) -> str:
    """What a process is, for the CPU profile; Ray's process titles name its actors ("ray::ServeReplica:...")."""
    try:
        cmd = proc.cmdline()
    except Exception:
        return proc.name()
    line = " ".join(cmd)
    if proc.pid == os.getpid():
        return "load client (this process)"
    if "engine.engine_process" in line:
        return "engine process"
    if line.startswith("ray::"):
        title = cmd[0].removeprefix("ray::")
        for key, name in (("ProxyActor", "Serve proxy"), ("LLMServer", "LLM replica"), ("OpenAIIngress", "ingress"),
                          ("MetricsHub", "metrics hub"), ("DraftActor", "draft actor"),
                          ("ServeController", "Serve controller"), ("HAProxyManager", "HAProxy manager")):
            if key in title:
                return name
        return "ray::" + title.split(":")[0].split(".")[0]
    for key in ("raylet", "gcs_server", "dashboard", "log_monitor", "monitor.py", "runtime_env", "default_worker"):
        if key in line:
            return "ray " + key.removesuffix(".py")
    return proc.name()


def cpu_snapshot() -> dict[int, tuple[str, float, int, list[int]]]:
    """Every process of this user: (label, CPU seconds so far, threads, allowed cores)."""
    import psutil

    out = {}
    me = os.getuid()
    for proc in psutil.process_iter():
        try:
            if proc.uids().real != me:
                continue
            t = proc.cpu_times()
            out[proc.pid] = (_label(proc), t.user + t.system, proc.num_threads(), proc.cpu_affinity())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


def cpu_profile(before: dict, after: dict, wall_s: float, tokens: int) -> dict:
    """CPU time per kind of process over a level: cores kept busy on average, and CPU ms per output token."""
    groups: dict[str, dict] = {}
    for pid, (label, cpu, threads, cores) in after.items():
        used = cpu - (before[pid][1] if pid in before else 0.0)
        g = groups.setdefault(label, {"processes": 0, "cpu_s": 0.0, "threads": 0, "cores": sorted(cores)})
        g["processes"] += 1
        g["cpu_s"] += used
        g["threads"] += threads
    for g in groups.values():
        g["busy_cores"] = g["cpu_s"] / wall_s
        g["cpu_ms_per_token"] = 1000 * g["cpu_s"] / max(tokens, 1)
    return dict(sorted(groups.items(), key=lambda kv: -kv[1]["cpu_s"]))


def server_step_counters(url: str) -> dict:
    import httpx

    s = httpx.get(f"{url}/stats", timeout=30).json()
    return {"steps": s.get("steps", 0), "step_time_s": s.get("step_time_s", 0.0)}


def step_ms(before: dict, after: dict) -> float:
    steps = after["steps"] - before["steps"]
    return 1000 * (after["step_time_s"] - before["step_time_s"]) / steps if steps else float("nan")


def compare_level(url: str, local: InProcess, prompts: list, c: int, n: int, max_tokens: int, mode: str,
                  level_time: float, rounds: int, slo: tuple[float, float]) -> dict:
    """One level over HTTP and in process, alternating for `rounds` rounds (order flipped every round) so that both
    sides of a ratio ran within seconds of each other on this shared machine; the ratio is the median of the
    rounds' ratios. The HTTP side's CPU profile comes from the last round; `rounds_detail` has each round's mean
    engine step per side and the engine process's busy cores over HTTP."""
    http, inproc = [], []
    for r in range(rounds):
        for side in (("http", "local") if r % 2 == 0 else ("local", "http")):
            if side == "http":
                cpu0, steps0 = cpu_snapshot(), server_step_counters(url)
                res = asyncio.run(run_level(url, prompts, c, n, max_tokens, mode, level_time))
                s = summarize(res, *slo)
                s["step_ms"] = step_ms(steps0, server_step_counters(url))
                s["cpu_profile"] = cpu_profile(cpu0, cpu_snapshot(), s["wall_s"], s["output_tokens"])
                http.append((s, res))
            else:
                steps0 = local.step_counters()
                res = local.level(c, n, max_tokens, mode)
                s = summarize(res, *slo)
                s["step_ms"] = step_ms(steps0, local.step_counters())
                inproc.append((s, res))
    ratios = [h["throughput_tok_s"] / x["throughput_tok_s"] for (h, _), (x, _) in zip(http, inproc)]
    texts_http = {r["index"]: r["text"] for _, res in http for r in res if "error" not in r}
    texts_local = {r["index"]: r["text"] for _, res in inproc for r in res}
    common = set(texts_http) & set(texts_local)
    return {
        "http": http[-1][0], "in_process": inproc[-1][0],
        "http_tok_s": [s["throughput_tok_s"] for s, _ in http],
        "in_process_tok_s": [s["throughput_tok_s"] for s, _ in inproc],
        "ratio": statistics.median(ratios), "ratios": ratios,
        "ttft_p50_gap_ms": 1000 * statistics.median(h["ttft_s"]["p50"] - x["ttft_s"]["p50"]
                                                    for (h, _), (x, _) in zip(http, inproc)),
        "step_ms": {"http": statistics.median(s["step_ms"] for s, _ in http),
                    "in_process": statistics.median(s["step_ms"] for s, _ in inproc)},
        "rounds_detail": [{"step_ms_http": h["step_ms"], "step_ms_in_process": x["step_ms"],
                           "engine_cores_http": h["cpu_profile"].get("engine process", {}).get("busy_cores")}
                          for (h, _), (x, _) in zip(http, inproc)],
        # Greedy texts should match; bf16 batch effects can flip a near-tie, so this is reported, not asserted.
        "greedy_text_match": sum(texts_http[i] == texts_local[i] for i in common) / max(len(common), 1),
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
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the actor: one thread on the one core each pair is pinned to
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
        torch.set_num_threads(threads)
        ray.kill(actor, no_restart=True)
    return out


# ----- main -------------------------------------------------------------------------------------------------------


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(20, 8))
    panels = [("ttft_s", "p50", "TTFT p50 (s)"), ("tpot_s", "p50", "TPOT p50 (s)"), ("itl_s", "p50", "ITL p50 (s)"),
              ("throughput_tok_s", None, "output tokens/s (dashed: in process)"),
              ("goodput_req_s", None, "goodput (req/s within SLO)")]
    for ax, (key, sub, title) in zip(axes.flat, panels):
        for side, style in (("levels", "-"), ("in_process", "--")):
            if side == "in_process" and key != "throughput_tok_s":
                continue
            for j, (mode, levels) in enumerate(result.get(side, {}).items()):
                cs = sorted(int(c) for c in levels)
                ys = [levels[str(c)][key][sub] if sub else levels[str(c)][key] for c in cs]
                ax.plot(cs, ys, style, marker="o", color=f"C{j}", label=mode if side == "levels" else None)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    ax = axes.flat[6]
    for j, (mode, levels) in enumerate(result.get("compare", {}).items()):
        cs = sorted(int(c) for c in levels)
        ax.plot(cs, [levels[str(c)]["ratio"] for c in cs], marker="o", color=f"C{j}", label=mode)
    ax.axhline(0.9, color="grey", ls=":", label="goal 0.9")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_title("HTTP / in-process tokens/s")
    ax.grid(alpha=0.3)
    ax.legend()
    axes.flat[7].axis("off")
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
    ap.add_argument("--modes", default="off,adaptive+lookup")
    ap.add_argument("--max-tokens", type=int, default=None, help="default 128 (quick 32)")
    ap.add_argument("--requests", type=int, default=None, help="per level (default max(8, 3 x C); quick 2 x C)")
    ap.add_argument("--level-time-s", type=float, default=None, help="per level (default 180; quick 60)")
    ap.add_argument("--slo-ttft-s", type=float, default=2.0)
    ap.add_argument("--slo-tpot-ms", type=float, default=200.0)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads of the in-process engine (default: every core this process may use)")
    ap.add_argument("--rounds", type=int, default=None, help="HTTP / in-process alternations per level (default 2)")
    ap.add_argument("--ingress-mode", default="in_replica", help="the app layout (ingress_mode; dspark serve's "
                    "default)")
    ap.add_argument("--http-proxy", default="haproxy", choices=["haproxy", "ray"],
                    help="the local app's HTTP front (deployments.launch.local_serve; dspark serve's default)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="a serving config field for the local app, dotted for nested ones (torch_threads=2, "
                         "draft_actor.num_cpus=0); repeatable")
    ap.add_argument("--skip-actor", action="store_true", help="skip the draft actor vs in-process drafter rounds")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch

    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from draft_service.prompts import load_prompts
    from engine.config import EngineConfig
    from engine.loader import resolve_model

    q = args.quick
    conc = [int(c) for c in (args.concurrency or ("1,4" if q else "1,4,16,64")).split(",")]
    modes = args.modes.split(",")
    max_tokens = args.max_tokens or (32 if q else 128)
    level_time = args.level_time_s or (60.0 if q else 180.0)
    rounds = args.rounds or 2
    overrides = {}
    for item in args.set:
        key, value = item.split("=", 1)
        *parents, leaf = key.split(".")
        node = overrides
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = json.loads(value)
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
        url, stop = start_local_app(engine_cfg, args.replicas, args.ingress_mode, overrides, args.http_proxy)
    import httpx

    info = httpx.get(f"{url}/stats", timeout=30).json()
    result = {"config": {"model": args.model or "SmolLM2-135M-Instruct", "drafter": args.drafter, "dtype": args.dtype,
                         "max_tokens": max_tokens, "concurrency": conc, "modes": modes, "quick": q,
                         "replicas": args.replicas, "url": url, "cpus": os.cpu_count(), "in_process_threads": threads,
                         "rounds": rounds, "ingress_mode": args.ingress_mode, "http_proxy": args.http_proxy, "serving_overrides": overrides},
              "slo": {"ttft_s": args.slo_ttft_s, "tpot_s": args.slo_tpot_ms / 1000},
              "server": {"drafter_error": info.get("drafter_error"),
                         "speculation": bool(info.get("speculation"))},
              "levels": {m: {} for m in modes}}
    slo = (args.slo_ttft_s, args.slo_tpot_ms / 1000)
    local = InProcess(engine_cfg, prompts)
    result["in_process"] = {m: {} for m in modes}
    result["compare"] = {m: {} for m in modes}
    try:
        for c in conc:
            n = args.requests or (2 * c if q else max(8, 3 * c))
            for mode in modes:
                t0 = time.perf_counter()
                cmp = compare_level(url, local, prompts, c, n, max_tokens, mode, level_time, rounds, slo)
                s, x = cmp.pop("http"), cmp.pop("in_process")
                result["levels"][mode][str(c)] = s
                result["in_process"][mode][str(c)] = x
                result["compare"][mode][str(c)] = cmp
                print(f"C={c:<3} {mode:<9} {s['requests']:>3} req ({s['failed']} failed)"
                      f" in {time.perf_counter() - t0:5.1f} s"
                      f"  TTFT p50 {s['ttft_s']['p50']:.3f} s  TPOT p50 {1000 * s['tpot_s']['p50']:.1f} ms"
                      f"  {s['throughput_tok_s']:.1f} tok/s (in process {x['throughput_tok_s']:.1f}: ratio"
                      f" {cmp['ratio']:.2f}, TTFT gap {cmp['ttft_p50_gap_ms']:.0f} ms, step"
                      f" {cmp['step_ms']['http']:.1f} / {cmp['step_ms']['in_process']:.1f} ms)"
                      f"  accept len {s['mean_acceptance_length']:.2f}", flush=True)
                top = list(s["cpu_profile"].items())[:6]
                print("      CPU busy cores: " + ", ".join(f"{k} {v['busy_cores']:.2f}" for k, v in top), flush=True)
    finally:
        if stop:
            stop()
        del local
    try:
        if args.skip_actor:
            raise RuntimeError("skipped (--skip-actor)")
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
