"""Reliability of the Serve app: load, faults, disconnects and hostile input, with nothing lost and nothing leaked.

Checks (each bounded in requests and time; traffic only to loopback):
    load     a burst of N concurrent streaming greedy chat requests on the default model and drafter (after a
             warm-up burst): every request completes or gets an explicit 429/503, none hangs or is cut short
             silently, every completed answer equals the request sent alone (or differs only at a float64 logit
             near-tie); afterwards KV blocks, draft contexts and the queue are back to 0 and the replica's RSS
             within 10% of its post-warm-up level (all read from /metrics).
    faults   tiny random models with a tiny drafter in the co-located draft actor (float64, so greedy answers
             are exact): the draft actor killed mid-generation (plain-decoding fallback, identical answers, restart,
             contexts rebuilt from the taps, speculation resumes, draft_fallbacks_total); a client socket closed
             mid-stream (request aborted, KV and draft context freed); more KV demand than the cache holds
             (preempted or queued, all complete, identical answers); a broken drafter folder (the replica serves
             without speculation, says so, does not crash-loop); the LLM replica killed (in-flight requests end
             with a clear error, Serve replaces it, recovery time measured).
    fuzz     schemathesis over the app's own /openapi.json (positive and negative cases): no 5xx, every error in
             OpenAI's shape and in the documented statuses.

    .venv/bin/python bench/reliability.py                     # all three, then the table and the JSON
    .venv/bin/python bench/reliability.py --only faults,fuzz --fuzz-examples 300
Writes bench/results/reliability.json. The tests in tests/deployments/test_reliability_*.py run the same checks (smaller where
needed) through the helpers below.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/reliability.py`: the tiny-model helpers live in tests/
    sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from deployments.launch import App, local_serve, run_app  # noqa: E402  (the cluster and the apps; after sys.path)

LEAK_GAUGES = ("dspark:kv_blocks_used", "dspark:draft_contexts_live", "vllm:num_requests_waiting",
               "vllm:num_requests_running")
ERROR_KEYS = {"message", "type", "param", "code"}


# ----- polling ------------------------------------------------------------------------------------------------------


def wait_until(fn, timeout_s: float, interval_s: float = 0.2, what: str = "condition"):
    """Poll fn() until it returns something truthy; that value, or AssertionError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        try:
            last = fn()
        except Exception as exc:  # a transient failure while polling counts as "not yet"
            last = exc
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s:.0f} s (last: {last!r})")
        time.sleep(interval_s)


# ----- metrics ------------------------------------------------------------------------------------------------------


def scrape(app: App) -> list[tuple[str, dict, float]]:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx.get(f"{app.base}/metrics", timeout=30)
    assert r.status_code == 200, r.text
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(r.text) for s in fam.samples]


def metric(samples, name: str, **labels) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    return sum(v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items()))


def llm_replicas(samples) -> set[str]:
    return {lab["replica"] for n, lab, _ in samples if n == "vllm:num_requests_running"}


def wait_scrape(app: App, check, timeout_s: float, what: str) -> list:
    """Scrape /metrics until check(samples) holds; those samples."""
    def ready():
        samples = scrape(app)
        return samples if check(samples) else None

    return wait_until(ready, timeout_s, 0.3, what)


def leak_gauges(samples) -> dict[str, float]:
    return {name.split(":", 1)[1]: metric(samples, name) for name in LEAK_GAUGES}


def wait_drained(app: App, timeout_s: float = 30.0) -> list:
    """Scrape until every LLM replica reports no running or waiting request, no KV block and no draft context."""
    def drained():
        samples = scrape(app)
        return samples if llm_replicas(samples) and not any(leak_gauges(samples).values()) else None

    return wait_until(drained, timeout_s, 0.5, "KV blocks, draft contexts and queue back to 0")


def stats(app: App, timeout_s: float = 60.0) -> dict:
    """/stats of one LLM replica (the router's pick; with one replica, that replica), draft actor included."""
    return app.handle().stats.remote().result(timeout_s=timeout_s)


# ----- requests -----------------------------------------------------------------------------------------------------


def error_shape_ok(body, status: int) -> bool:
    """OpenAI's error shape: {"error": {"message": str, "type": str, "param": str | None, "code": status}}."""
    err = body.get("error") if isinstance(body, dict) else None
    return (isinstance(err, dict) and set(err) == ERROR_KEYS and isinstance(err["message"], str)
            and bool(err["message"]) and isinstance(err["type"], str) and (err["param"] is None
            or isinstance(err["param"], str)) and err["code"] == status)


async def stream_request(client, path: str, body: dict, timeout_s: float = 300.0) -> dict:
    """One streaming request, read to the end. The result says how it ended:
    completed (200, a finish_reason, [DONE]), refused (429/503 JSON error), error (an error event in the stream or
    another 4xx/5xx JSON error: a clear error), or broken (anything else: cut short, hung, malformed)."""
    res = {"status": None, "text": "", "finish_reason": None, "error": None, "done": False, "metrics": None,
           "usage": None, "ttft_s": None, "latency_s": None, "retry_after": None, "start": time.monotonic()}
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", path, json=body) as r:
                res["status"] = r.status_code
                if r.status_code != 200:
                    raw = await r.aread()
                    try:
                        payload = json.loads(raw)
                    except ValueError:
                        payload = None
                    res["error"] = (payload or {}).get("error", {}).get("message") if isinstance(payload, dict) \
                        else raw[:200].decode("utf-8", "replace")
                    res["error_shape_ok"] = error_shape_ok(payload, r.status_code)
                    res["retry_after"] = r.headers.get("retry-after")
                else:
                    async for line in r.aiter_lines():
                        if not line:
                            continue
                        if not line.startswith("data: ") or res["done"]:
                            res["malformed"] = line[:200]
                            break
                        data = line[len("data: "):]
                        if data == "[DONE]":
                            res["done"] = True
                            continue
                        event = json.loads(data)
                        if "error" in event:
                            res["error"] = event["error"].get("message")
                            res["error_shape_ok"] = error_shape_ok(event, event["error"].get("code"))
                            continue
                        for choice in event.get("choices", []):
                            piece = (choice.get("delta") or {}).get("content") if "delta" in choice \
                                else choice.get("text")
                            if piece:
                                if res["ttft_s"] is None:
                                    res["ttft_s"] = time.perf_counter() - t0
                                res["text"] += piece
                            if choice.get("finish_reason"):
                                res["finish_reason"] = choice["finish_reason"]
                        if event.get("metrics"):
                            res["metrics"] = event["metrics"]
                        if event.get("usage"):
                            res["usage"] = event["usage"]
    except TimeoutError:
        res["error"] = f"no end within {timeout_s:.0f} s"
        res["hung"] = True
    except Exception as exc:  # connection reset, protocol error: the stream was cut short
        res["error"] = f"transport: {exc!r}"
        res["transport_error"] = True
    res["latency_s"] = time.perf_counter() - t0
    res["end"] = time.monotonic()
    res["outcome"] = outcome(res)
    return res


def outcome(res: dict) -> str:
    status = res["status"]
    if res.get("hung") or res.get("transport_error") or res.get("malformed"):
        return "broken"
    if status == 200:
        if res["error"] is not None:
            return "error" if res["done"] and res.get("error_shape_ok") else "broken"
        return "completed" if res["done"] and res["finish_reason"] in ("stop", "length") else "broken"
    if status in (429, 503) and res.get("error_shape_ok"):
        return "refused"
    if status is not None and status >= 400 and res.get("error_shape_ok"):
        return "error"
    return "broken"


async def run_streams(base: str, requests: list[tuple[str, dict]], timeout_s: float = 300.0) -> list[dict]:
    """All `requests` ((path, body) pairs) at once, each streamed to its end (bounded by timeout_s)."""
    import httpx

    limits = httpx.Limits(max_connections=len(requests) + 8, max_keepalive_connections=len(requests) + 8)
    timeout = httpx.Timeout(timeout_s, connect=60.0)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=timeout) as client:
        return await asyncio.gather(*[stream_request(client, p, b, timeout_s) for p, b in requests])


def counts(results: list[dict]) -> dict:
    out = {"requests": len(results)}
    for key in ("completed", "refused", "error", "broken"):
        out[key] = sum(r["outcome"] == key for r in results)
    out["status"] = {str(s): sum(r["status"] == s for r in results) for s in sorted({r["status"] or 0
                                                                                     for r in results})}
    lat = [r["latency_s"] for r in results if r["outcome"] == "completed"]
    out["max_latency_s"] = max(lat) if lat else None
    return out


def raw_stream_then_close(port: int, path: str, body: dict, min_events: int = 2, timeout_s: float = 60.0) -> dict:
    """Send a streaming request over a plain socket, read until `min_events` SSE events arrived, then close the
    socket (a real client disconnect). Returns what was read."""
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nAccept: text/event-stream\r\n\r\n").encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    received = b""
    try:
        sock.sendall(head + payload)
        deadline = time.monotonic() + timeout_s
        while received.count(b"data: ") < min_events:
            assert time.monotonic() < deadline, f"only {received[:300]!r} within {timeout_s} s"
            if b"\r\n" in received and b" 200 " not in received.split(b"\r\n", 1)[0]:
                break  # refused (e.g. 400): no stream will come
            chunk = sock.recv(65536)
            assert chunk, f"the server closed the stream early: {received[:300]!r}"
            received += chunk
    finally:
        sock.close()
    return {"closed_at": time.monotonic(), "head": received.split(b"\r\n", 1)[0].decode(),
            "events": received.count(b"data: ")}


# ----- load: the default model and drafter ------------------------------------------------------------------------


def default_drafter_available() -> bool:
    from engine.loader import DEFAULT_DRAFTER

    return (DEFAULT_DRAFTER / "config.json").exists()


def load_config(kv_gb: float = 0.3, dtype: str = "float32", max_num_seqs: int = 64):
    """The default model with drafter="default" in its co-located actor (adaptive speculation), float32 so that
    batched-vs-alone differences can only come from rounding at genuine near-ties (checked against float64)."""
    from deployments.config import LLMServingConfig, MetricsOptions
    from engine import EngineConfig

    engine = EngineConfig(dtype=dtype, device="cpu", kv_cache_memory_gb=kv_gb, drafter="default",
                          max_num_seqs=max_num_seqs)
    return LLMServingConfig(engine=engine, drafter_mode="actor", metrics=MetricsOptions(push_interval_s=0.5))


def load_prompts_for_burst(distinct: int) -> list[list[dict]]:
    """`distinct` held-out chat prompts (the shortest, so a burst stays cheap), as message lists."""
    from draft_service.prompts import load_prompts

    seen, out = set(), []
    for rec in sorted(load_prompts("heldout"), key=lambda r: (sum(len(m["content"]) for m in r["messages"]),
                                                               json.dumps(r["messages"]))):
        key = json.dumps(rec["messages"])
        if key not in seen:
            seen.add(key)
            out.append(rec["messages"])
        if len(out) == distinct:
            break
    return out


def chat_body(messages, max_tokens: int) -> dict:
    return {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}


class AloneReference:
    """The answer each prompt gets sent alone: an in-process LLMEngine with the replica's engine config, one request
    at a time (greedy), on `threads` torch threads like the replica (its num_cpus: 1). Also the float64
    transformers reference for near-tie checks."""

    def __init__(self, engine_config, threads: int = 1):
        from engine import LLMEngine

        self.threads = threads
        with self._threads():
            self.engine = LLMEngine(engine_config)
        self.tokenizer = self.engine.tokenizer
        self._f64 = None
        self._n = 0

    def prompt_ids(self, messages) -> list[int]:
        return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                       return_dict=True)["input_ids"])

    @contextmanager
    def _threads(self):
        import torch

        old = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(old)

    def run(self, prompt_ids: list[int], max_tokens: int):
        from engine import SamplingParams

        self._n += 1
        rid = f"alone{self._n}"
        with self._threads():
            self.engine.add_request(rid, prompt_ids, SamplingParams(max_tokens=max_tokens))
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished and out.request_id == rid:
                        return out
        raise AssertionError("the reference engine lost the request")

    def near_tie(self, prompt_ids: list[int], want_ids: list[int], got_text: str, gap_limit: float = 1e-3) -> dict:
        """Is `got_text` (a served answer) the alone answer `want_ids` up to a genuine logit near-tie? At the first
        token where they part, the float64 model's top two tokens must be the alone token and one that continues
        `got_text`, less than `gap_limit` apart."""
        import torch

        if self._f64 is None:
            from transformers import AutoModelForCausalLM

            self._f64 = AutoModelForCausalLM.from_pretrained(self.engine.model_path, dtype=torch.float64).eval()
        dec = self.tokenizer.decode
        d = next((i for i in range(len(want_ids)) if not got_text.startswith(dec(want_ids[: i + 1]))), None)
        if d is None:
            return {"near_tie": False, "why": "the served text extends the alone text (an earlier stop?)"}
        with torch.no_grad():
            logits = self._f64(torch.tensor([prompt_ids + want_ids[:d]])).logits[0, -1]
        top2 = logits.topk(2).indices.tolist()
        other = [t for t in top2 if t != want_ids[d]]
        prefix = dec(want_ids[:d])
        ok_other = bool(other) and (got_text.startswith(dec(want_ids[:d] + other[:1]))
                                    or (got_text == prefix and other[0] in self.engine.eos_token_ids))
        gap = abs(float(logits[top2[0]] - logits[top2[1]]))
        return {"near_tie": want_ids[d] in top2 and ok_other and gap < gap_limit, "position": d, "gap": gap,
                "top2": top2, "alone_token": want_ids[d]}


SETTLE_S = 2.5  # idle long enough for the engine to trim its heap and for a fresh metrics snapshot to arrive


def run_load(app: App, reference: AloneReference, n_requests: int = 256, distinct: int = 16, max_tokens: int = 16,
             warmup: int = 64, timeout_s: float = 600.0, log=print) -> dict:
    """The burst check on a deployed app (see the module docstring); returns the numbers and the problems found."""
    prompts = load_prompts_for_burst(distinct)
    path = "/v1/chat/completions"
    problems: list[str] = []

    t0 = time.perf_counter()
    warm = asyncio.run(run_streams(app.base, [(path, chat_body(prompts[i % distinct], max_tokens))
                                              for i in range(warmup)], timeout_s))
    log(f"warm-up burst of {warmup}: {counts(warm)} in {time.perf_counter() - t0:.1f} s")
    wait_drained(app, 60)
    time.sleep(SETTLE_S)
    before = scrape(app)
    rss_before = metric(before, "dspark:replica_rss_bytes")

    t0 = time.perf_counter()
    results = asyncio.run(run_streams(app.base, [(path, chat_body(prompts[i % distinct], max_tokens))
                                                 for i in range(n_requests)], timeout_s))
    burst_s = time.perf_counter() - t0
    summary = counts(results)
    log(f"burst of {n_requests}: {summary} in {burst_s:.1f} s")
    for r in results:
        if r["outcome"] not in ("completed", "refused"):
            problems.append(f"request ended {r['outcome']}: status {r['status']}, {r['error']!r}")

    t0 = time.perf_counter()
    after = wait_drained(app, 60)
    drain_s = time.perf_counter() - t0
    time.sleep(SETTLE_S)
    after = scrape(app)
    rss_after = metric(after, "dspark:replica_rss_bytes")
    leaks = leak_gauges(after)
    rss_delta = (rss_after - rss_before) / rss_before if rss_before else float("nan")
    if any(leaks.values()):
        problems.append(f"leaked after the burst: {leaks}")
    if not abs(rss_delta) <= 0.10:
        problems.append(f"replica RSS {rss_before / 2**20:.0f} MiB -> {rss_after / 2**20:.0f} MiB ({rss_delta:+.1%})")

    # Every completed answer equals the same request sent alone (or parts from it at a float64 near-tie).
    alone = {}
    t0 = time.perf_counter()
    for i, messages in enumerate(prompts):
        ids = reference.prompt_ids(messages)
        alone[i] = (ids, reference.run(ids, max_tokens))
    ref_s = time.perf_counter() - t0
    equal, near_ties = 0, []
    for i, r in enumerate(results):
        if r["outcome"] != "completed":
            continue
        ids, want = alone[i % distinct]
        if r["text"] == want.text and r["finish_reason"] == want.finish_reason:
            equal += 1
            continue
        tie = reference.near_tie(ids, want.token_ids, r["text"])
        near_ties.append({"request": i, "prompt": i % distinct, **tie})
        if not tie["near_tie"]:
            problems.append(f"request {i} differs from prompt {i % distinct} sent alone, not at a near-tie: {tie} "
                            f"(served {r['text']!r}, alone {want.text!r})")
    spec = {"speculation_enabled": metric(after, "dspark:speculation_enabled"),
            "drafter_error": metric(after, "dspark:drafter_error"),
            "drafts": metric(after, "vllm:spec_decode_num_drafts_total"),
            "accepted_tokens": metric(after, "vllm:spec_decode_num_accepted_tokens_total"),
            "fallbacks": metric(after, "dspark:draft_fallbacks_total")}
    return {**summary, "burst_s": burst_s, "drain_s": drain_s, "reference_s": ref_s, "distinct_prompts": distinct,
            "max_tokens": max_tokens, "warmup": warmup, "equal_to_alone": equal, "near_ties": near_ties,
            "leaks": leaks, "rss_before_bytes": rss_before, "rss_after_bytes": rss_after, "rss_delta": rss_delta,
            "speculation": spec, "problems": problems}


# ----- faults: tiny models ------------------------------------------------------------------------------------------


def tiny_models(folder: Path, vocab_size: int | None = 512, max_positions: int = 4096) -> tuple[Path, Path]:
    """A tiny random Llama with the default model's tokenizer files, and a tiny random DSpark drafter for it.
    vocab_size 512 (fault checks): draft rounds stay cheap; prompts are token ids below 512 (text would tokenize
    past the vocabulary). None: the tokenizer's whole vocabulary (text prompts and chat work; the fuzz app)."""
    from tests.helpers import make_tiny_model
    from tests.helpers import make_tiny_drafter
    from transformers import AutoTokenizer

    from engine.loader import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(None))
    vocab_size = vocab_size or len(tokenizer)
    target = make_tiny_model("llama", folder / "target", tokenizer, vocab_size=vocab_size,
                             max_position_embeddings=max_positions)
    return target, make_tiny_drafter(folder / "drafter", vocab_size)


def faults_config(target: Path, drafter: Path | None, kv_gb: float = 0.01, max_num_seqs: int = 8, **serving):
    """float64 tiny target + tiny drafter in the draft actor, `fixed:3` speculation (drafts every step), a small KV
    cache (~2300 tokens beside the prefix cache's taps, so a few long requests exhaust it), fast health checks (a
    dead replica is noticed soon)."""
    from deployments.config import DeploymentOptions, LLMServingConfig, MetricsOptions, RequestLimits
    from engine import EngineConfig

    engine = EngineConfig(model=str(target), dtype="float64", device="cpu", kv_cache_memory_gb=kv_gb,
                          drafter=None if drafter is None else str(drafter), speculation="fixed:3",
                          max_num_seqs=max_num_seqs, max_num_batched_tokens=256)
    serving.setdefault("llm", DeploymentOptions(max_queued_requests=1024, health_check_period_s=1.0,
                                                health_check_timeout_s=10.0, graceful_shutdown_timeout_s=2.0))
    serving.setdefault("limits", RequestLimits(max_tokens=4096))
    return LLMServingConfig(engine=engine, served_model_name="tiny", drafter_mode="actor",
                            metrics=MetricsOptions(push_interval_s=0.5, stale_after_s=5.0), **serving)


def prompt_ids(i: int, length: int = 12, vocab_size: int = 512) -> list[int]:
    """A distinct token-id prompt (ids 3..vocab_size-1, away from BOS/EOS/PAD)."""
    return [3 + (i * 7919 + j * 104729) % (vocab_size - 3) for j in range(length)]


def completion_body(ids: list[int], max_tokens: int, stream: bool = True) -> dict:
    return {"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}


def plain_reference(target: Path, prompts: list[list[int]], max_tokens: int | list[int]) -> list:
    """Unfaulted greedy answers: the same float64 target without speculation, in process."""
    from engine import EngineConfig, LLMEngine, SamplingParams

    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)  # one busy core is enough to stall a second thread at every parallel region
    try:
        eng = LLMEngine(EngineConfig(model=str(target), dtype="float64", device="cpu", kv_cache_memory_gb=0.05,
                                     max_num_seqs=16, max_num_batched_tokens=512))
        lengths = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
        for i, (p, n) in enumerate(zip(prompts, lengths)):
            eng.add_request(f"p{i}", p, SamplingParams(max_tokens=n, ignore_eos=True))
        done = {}
        while eng.has_unfinished_requests():
            for out in eng.step():
                if out.finished:
                    done[out.request_id] = out
    finally:
        torch.set_num_threads(old)
    return [done[f"p{i}"] for i in range(len(prompts))]


def draft_actor(app: App):
    """(handle, placement info) of the draft actor of the app's LLM replica (with one replica: that one)."""
    import ray

    info = app.handle().placement.remote().result(timeout_s=60)
    actor = info["draft_actor"]
    assert actor is not None, info
    return ray.get_actor(actor["name"], namespace=actor["namespace"]), info


def llm_replica_actor(app: App):
    """(replica id, actor handle) of the LLM replica the router picks (with one replica: that one)."""
    import ray

    info = app.handle().placement.remote().result(timeout_s=60)
    return info["replica"], ray.get_actor(info["actor_name"], namespace="serve")  # Serve's actors live there


def check_draft_actor_kill(app: App, target: Path, max_tokens: int = 700, concurrency: int = 2,
                           timeout_s: float = 150.0, log=print) -> dict:
    """Kill the draft actor while requests generate; keep `concurrency` long greedy streams going until
    speculation has resumed (and one more round), then compare every answer with the unfaulted reference."""
    import ray

    problems: list[str] = []
    actor, info = draft_actor(app)
    first = info["draft_actor"]["incarnation"]
    s0 = stats(app)["spec"]
    events: dict = {}
    results: list[dict] = []
    next_id = iter(range(10**6))

    async def client_loop(client, stop_at, first_max_tokens):
        tokens = first_max_tokens
        while time.monotonic() < stop_at and not events.get("done"):
            ids = prompt_ids(next(next_id))
            res = await stream_request(client, "/v1/completions", completion_body(ids, tokens), timeout_s)
            res["prompt"], res["max_tokens"] = ids, tokens
            results.append(res)
            tokens = max_tokens

    def watcher(t_start):
        """Kill once the streams are under way; then follow the engine's counters until drafting resumed."""
        while time.monotonic() - t_start < timeout_s:
            st = stats(app)
            spec = st["spec"]
            if "killed" not in events and spec["draft_rounds"] > s0["draft_rounds"] + 20:
                events["draft_rounds_at_kill"] = spec["draft_rounds"]
                events["killed"] = time.monotonic()
                ray.kill(actor, no_restart=False)  # a crash: Ray restarts it (max_restarts -1)
            elif "killed" in events and spec["fallbacks"] > s0["fallbacks"] and "fallback" not in events:
                events["fallback"] = time.monotonic()
                events["draft_rounds_at_fallback"] = spec["draft_rounds"]
            elif "fallback" in events and spec["draft_rounds"] > events["draft_rounds_at_fallback"]:
                events["resumed"] = time.monotonic()
                events["incarnation_after"] = (st.get("draft_actor") or {}).get("incarnation")
                events["live_contexts_after"] = (st.get("draft_actor") or {}).get("live_contexts")
                return
            if "fallback" in events:
                events["last_not_resumed"] = time.monotonic()
            # Poll closely during the outage: "last_not_resumed" bounds when drafting resumed, and a request counts
            # as having generated during the outage only if its first token came before it.
            time.sleep(0.02 if "fallback" in events else 0.1)

    async def main():
        import httpx

        t_start = time.monotonic()
        stop_at = t_start + timeout_s
        async with httpx.AsyncClient(base_url=app.base, timeout=httpx.Timeout(timeout_s, connect=60)) as client:
            # Staggered lengths: the loops' request boundaries fall at different times, so whenever drafting
            # resumes some loop is mid-request, with tokens generated during the outage.
            loops = [asyncio.create_task(client_loop(client, stop_at, max_tokens * (i + 1) // (concurrency + 1)))
                     for i in range(concurrency)]
            await asyncio.to_thread(watcher, t_start)
            events["done"] = True  # the loops finish their current request and stop
            await asyncio.gather(*loops)

    t0 = time.perf_counter()
    asyncio.run(main())
    wall = time.perf_counter() - t0
    for key in ("killed", "fallback", "resumed"):
        if key not in events:
            problems.append(f"no '{key}' event: {events}")
    if events.get("incarnation_after") in (None, first):
        problems.append(f"the draft actor did not come back as a new incarnation: {events}")
    drained = wait_drained(app, 30)
    fallbacks_metric = metric(drained, "dspark:draft_fallbacks_total")
    if fallbacks_metric < 1:
        problems.append("dspark:draft_fallbacks_total did not count the fallback")

    want = plain_reference(target, [r["prompt"] for r in results], [r["max_tokens"] for r in results])
    for r in results:
        r["spec_steps"] = ((r["metrics"] or {}).get("speculative_decoding") or {}).get("num_spec_steps", 0)
    spanned_kill, rebuilt = 0, 0
    for r, w in zip(results, want):
        if r["outcome"] != "completed":
            problems.append(f"a request ended {r['outcome']}: {r['error']!r}")
            continue
        if r["text"] != w.text:
            problems.append(f"an answer differs from the unfaulted run (prompt {r['prompt'][:4]}...)")
        if "killed" in events and r["start"] < events["killed"] < r["end"]:
            spanned_kill += 1
        # Started after the kill, producing tokens while drafting was off, and speculated (so after the restart):
        # its draft context was built from the engine's taps of tokens computed before the actor came back.
        if ("fallback" in events and "resumed" in events and events["killed"] < r["start"]
                and r["start"] + (r["ttft_s"] or 0) < events.get("last_not_resumed", 0) and r["spec_steps"] > 0):
            rebuilt += 1
    if not spanned_kill:
        problems.append("no request was in flight when the draft actor was killed")
    if not rebuilt:
        t0 = events.get("killed", 0)
        timeline = [(round(r["start"] - t0, 2), round(r["end"] - t0, 2), r["max_tokens"], r["spec_steps"])
                    for r in results]
        problems.append("no request that generated during the outage speculated after the restart: "
                        f"events {({k: round(v - t0, 2) for k, v in events.items() if isinstance(v, float)})}, "
                        f"requests (start, end, max_tokens, spec steps) {timeline}")
    return {"requests": len(results), "completed": sum(r["outcome"] == "completed" for r in results),
            "identical": sum(r["outcome"] == "completed" and r["text"] == w.text for r, w in zip(results, want)),
            "in_flight_at_kill": spanned_kill, "rebuilt_and_speculated": rebuilt,
            "fallbacks_total": fallbacks_metric,
            "resume_after_kill_s": (events["resumed"] - events["killed"]) if "resumed" in events else None,
            "wall_s": wall, "problems": problems}


def check_disconnect(app: App, max_tokens: int = 2000, log=print) -> dict:
    """Close a client socket mid-stream: the request is aborted and its KV blocks and draft context are freed (the
    abort reaches the engine within one step of arriving; from the socket close it also crosses proxy and ingress)."""
    problems: list[str] = []
    wait_drained(app, 30)
    before = stats(app)
    aborts_before = metric(scrape(app), "vllm:request_success_total", finished_reason="abort")
    read = raw_stream_then_close(app.port, app.route_prefix.rstrip("/") + "/v1/completions",
                                 completion_body(prompt_ids(424242), max_tokens), min_events=3)
    if "200" not in read["head"]:
        problems.append(f"stream did not start: {read}")

    def freed():
        st = stats(app)
        actor = st.get("draft_actor") or {}
        idle = (st["in_flight"], st["num_running"], st["num_waiting"], st["kv_blocks_used"]) == (0, 0, 0, 0)
        return st if idle and actor.get("live_contexts", 0) == 0 else None

    st = wait_until(freed, 30, 0.02, "the aborted request's KV blocks and draft context freed")
    freed_s = time.monotonic() - read["closed_at"]
    steps = st["steps"] - before["steps"]
    generated = st["generation_tokens"] - before["generation_tokens"]
    if generated >= max_tokens:
        problems.append(f"the request ran to the end ({generated} tokens): not aborted")
    # The abort counter is current in the replica's next push, the draft-context gauge one push later (it is read
    # from the actor asynchronously): wait for both, so a push between them is not mistaken for a leak.
    samples = wait_scrape(app, lambda s: metric(s, "vllm:request_success_total", finished_reason="abort")
                          > aborts_before and not any(leak_gauges(s).values()), 15,
                          "the abort counted in vllm:request_success_total{finished_reason=abort} and the leak "
                          "gauges (KV blocks, draft contexts, queue) back to 0")
    leaks = leak_gauges(samples)
    return {"freed_after_close_s": freed_s, "engine_steps_after_start": steps, "tokens_generated": generated,
            "max_tokens": max_tokens, "leaks": leaks, "problems": problems}


def check_kv_exhaustion(app: App, target: Path, n: int = 8, prompt_len: int = 200, max_tokens: int = 400,
                        log=print) -> dict:
    """More KV demand than the cache holds: every request is preempted or queued, and all complete, identical to
    the unfaulted run."""
    problems: list[str] = []
    st = stats(app)
    capacity = st["kv_blocks_total"] * app.config.engine.block_size
    demand = n * (prompt_len + max_tokens)
    if demand <= capacity:
        problems.append(f"demand {demand} tokens does not exceed the cache ({capacity} tokens)")
    pre0, fb0 = st["preemptions"], (st.get("spec") or {}).get("fallbacks", 0)
    prompts = [prompt_ids(1000 + i, prompt_len) for i in range(n)]
    t0 = time.perf_counter()
    results = asyncio.run(run_streams(app.base, [("/v1/completions", completion_body(p, max_tokens))
                                                 for p in prompts], 300))
    wall = time.perf_counter() - t0
    st = stats(app)
    want = plain_reference(target, prompts, max_tokens)
    for r, w in zip(results, want):
        if r["outcome"] != "completed":
            problems.append(f"a request ended {r['outcome']}: {r['error']!r}")
        elif r["text"] != w.text:
            problems.append("an answer differs from the unfaulted run")
    leaks = leak_gauges(wait_drained(app, 30))
    return {"requests": n, "demand_tokens": demand, "cache_tokens": capacity,
            "completed": sum(r["outcome"] == "completed" for r in results), "preemptions": st["preemptions"] - pre0,
            "draft_fallbacks": (st.get("spec") or {}).get("fallbacks", 0) - fb0,
            "wall_s": wall, "leaks": leaks, "problems": problems}


def check_replica_kill(app: App, max_tokens: int = 2000, n_streams: int = 2, recovery_timeout_s: float = 180.0,
                       log=print) -> dict:
    """Kill the LLM replica under in-flight requests (streaming and not): each ends with a clear error (an error
    event then [DONE], or a 5xx JSON error), never a silent truncation; Serve replaces the replica and a new request
    succeeds within recovery_timeout_s (measured from the kill)."""
    import httpx
    import ray

    from ray import serve

    problems: list[str] = []
    old_replica, actor = llm_replica_actor(app)

    async def in_flight():
        timeout = httpx.Timeout(120, connect=30)
        async with httpx.AsyncClient(base_url=app.base, timeout=timeout) as client:
            streams = [asyncio.create_task(stream_request(client, "/v1/completions",
                                                          completion_body(prompt_ids(5000 + i), max_tokens), 120))
                       for i in range(n_streams)]
            plain = asyncio.create_task(client.post("/v1/completions",
                                                    json=completion_body(prompt_ids(6000), max_tokens, False)))
            await asyncio.to_thread(wait_until, lambda: stats(app)["num_running"] >= n_streams + 1, 60, 0.1,
                                    "the requests running")
            await asyncio.sleep(0.3)
            t_kill = time.monotonic()
            ray.kill(actor, no_restart=True)
            got = await asyncio.gather(*streams)
            try:
                resp = await plain
                plain_res = {"status": resp.status_code, "body": resp.json() if resp.headers.get(
                    "content-type", "").startswith("application/json") else resp.text[:200]}
            except Exception as exc:
                plain_res = {"status": None, "body": repr(exc)}
            return t_kill, got, plain_res

    t_kill, got, plain_res = asyncio.run(in_flight())
    for r in got:
        if r["outcome"] != "error" or r["finish_reason"] is not None:
            problems.append(f"an in-flight stream ended {r['outcome']} (finish {r['finish_reason']}, "
                            f"error {r['error']!r}, done {r['done']})")
    if not (plain_res["status"] and plain_res["status"] >= 500 and error_shape_ok(plain_res["body"],
                                                                                  plain_res["status"])):
        problems.append(f"the in-flight non-streaming request got {plain_res}")

    # Recovery: new requests until one succeeds (each bounded), then the new replica's identity.
    attempts, first_ok = 0, None
    with httpx.Client(base_url=app.base, timeout=60) as client:
        while time.monotonic() - t_kill < recovery_timeout_s:
            attempts += 1
            try:
                r = client.post("/v1/completions", json=completion_body(prompt_ids(7000), 8, False))
                if r.status_code == 200:
                    first_ok = time.monotonic() - t_kill
                    break
                if r.status_code < 500 and r.status_code != 429:
                    problems.append(f"recovery request got {r.status_code}: {r.text[:200]}")
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
    if first_ok is None:
        problems.append(f"no request succeeded within {recovery_timeout_s:.0f} s of the kill")
    def replaced():
        states = dict(serve.status().applications[app.name].deployments["LLMServer"].replica_states)
        return states if states == {"RUNNING": 1} else None

    # The old replica may linger in STOPPING after the new one serves; on a loaded machine that took over a minute.
    states = wait_until(replaced, recovery_timeout_s, 0.5, "one running replica")
    new_replica = stats(app)["replica"]
    if new_replica == old_replica:
        problems.append(f"the replica was not replaced: {states}")
    return {"in_flight_streams": len(got), "streams_with_error_event": sum(r["outcome"] == "error" for r in got),
            "non_streaming_status": plain_res["status"], "recovery_s": first_ok, "recovery_attempts": attempts,
            "errors_seen": sorted({(r["error"] or "")[:120] for r in got}), "problems": problems}


def broken_drafter(folder: Path, good: Path) -> Path:
    """A drafter folder that passes the config checks but cannot load (its weights are garbage)."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(good / "config.json", folder / "config.json")
    (folder / "model.safetensors").write_bytes(b"\x00this is not a safetensors file" * 10)
    return folder


def check_broken_drafter(app: App, watch_s: float = 8.0, log=print) -> dict:
    """A replica whose drafter cannot load serves without speculation, says so in its logs and metrics, and does
    not crash-loop (same replica, no restart, healthy, answering). Each request carries its own API key, so an app
    with a rate limit keyed by API key does not refuse them."""
    import httpx
    from ray import serve

    problems: list[str] = []
    info = app.handle().info.remote().result(timeout_s=60)
    if info["speculation"] or not info["drafter_error"]:
        problems.append(f"the replica claims speculation: {info}")
    replica = stats(app)["replica"]
    samples = wait_scrape(app, llm_replicas, 30, "replica metrics")
    gauges = {"drafter_error": metric(samples, "dspark:drafter_error"),
              "speculation_enabled": metric(samples, "dspark:speculation_enabled")}
    if gauges != {"drafter_error": 1.0, "speculation_enabled": 0.0}:
        problems.append(f"metrics say {gauges}")
    t_end = time.monotonic() + watch_s
    answers = 0
    with httpx.Client(base_url=app.base, timeout=60) as client:
        while time.monotonic() < t_end:
            r = client.post("/v1/completions", json=completion_body(prompt_ids(answers), 8, False),
                            headers={"Authorization": f"Bearer broken-drafter-check-{answers}"})
            if r.status_code != 200:
                problems.append(f"a request got {r.status_code}: {r.text[:200]}")
                break
            if r.json()["metrics"]["speculative_decoding"]["num_spec_steps"] != 0:
                problems.append("a request speculated")
            answers += 1
            time.sleep(0.5)
    status = serve.status().applications[app.name].deployments["LLMServer"]
    states = dict(status.replica_states)
    if states != {"RUNNING": 1} or stats(app)["replica"] != replica:
        problems.append(f"the replica restarted or is not running: {states}")
    log_lines = replica_log_lines(replica, "serving without speculation")
    if not log_lines:
        problems.append("the replica's log does not say it serves without speculation")
    return {"drafter_error": info["drafter_error"][:200], "gauges": gauges, "answers": answers,
            "replica_states": states, "log_line": (log_lines[0][:200] if log_lines else None), "problems": problems}


def replica_log_lines(replica_id: str, needle: str) -> list[str]:
    """Lines containing `needle` in this Ray session's Serve log files of one replica."""
    import ray

    logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    out = []
    for path in logs.glob(f"serve/*{replica_id}*.log"):
        out += [line for line in path.read_text(errors="replace").splitlines() if needle in line]
    return out


# ----- fuzz -------------------------------------------------------------------------------------------------------


def fuzz(app: App, examples: int = 100, seed: int | None = 0, time_limit_s: float = 300.0,
         log=print) -> dict:
    """schemathesis over the app's /openapi.json: for every operation, `examples` positive and `examples` negative
    generated requests (operations without inputs: as many as distinct). Checks: no 5xx; every 4xx/5xx is a JSON
    OpenAI error with code == status; statuses, content types and response bodies as documented; schema-invalid
    requests rejected. seed None: a random run (the bench); an int: the same requests every time (CI)."""
    import httpx
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                                   response_schema_conformance, status_code_conformance)

    doc = httpx.get(f"{app.base}/openapi.json", timeout=60).json()
    schema = schemathesis.openapi.from_dict(doc)
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
              negative_data_rejection]
    sent, statuses, failures, deadline = 0, {}, [], time.monotonic() + time_limit_s
    session = __import__("requests").Session()

    def record(case, mode):
        nonlocal sent
        if time.monotonic() > deadline:
            return
        try:
            response = case.call(base_url=app.base, session=session, timeout=120)
        except Exception as exc:
            failures.append({"operation": f"{case.method} {case.path}", "mode": mode, "error": f"transport: {exc!r}",
                             "body": _short(case.body)})
            return
        sent += 1
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        try:
            problems = _fuzz_problems(case, response, checks)
        except Exception as exc:  # a bug of this harness: report it, keep fuzzing
            problems = [f"harness error: {exc!r}"]
        if problems:
            failures.append({"operation": f"{case.method} {case.path}", "mode": mode, "status": response.status_code,
                             "problems": problems, "body": _short(case.body)})

    def _fuzz_problems(case, response, checks) -> list[str]:
        problems = []
        content_type = (response.headers.get("content-type") or [""])[0]  # lowercase keys, list values
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = None
            if not content_type.startswith("application/json") or not error_shape_ok(body, response.status_code):
                problems.append(f"error not in OpenAI's shape: {response.text[:200]!r}")
        elif content_type.startswith("text/event-stream"):
            if not response.text.rstrip().endswith("data: [DONE]"):
                problems.append(f"stream without [DONE]: {response.text[-200:]!r}")
        try:
            case.validate_response(response, checks=checks)
        except Exception as exc:
            problems.append(" ".join(str(exc).split())[:400] or repr(exc))
        return problems

    for result in schema.get_all_operations():
        op = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                strategy = op.as_strategy(generation_mode=mode)
            except Exception as exc:  # e.g. nothing to negate in an operation without inputs
                log(f"{op.method.upper()} {op.path} {mode.value}: no strategy ({type(exc).__name__})")
                continue

            @given(case=strategy)
            @settings(max_examples=examples, database=None, derandomize=seed is not None, deadline=None,
                      phases=[Phase.generate], suppress_health_check=list(HealthCheck), print_blob=False)
            def run(case):
                record(case, mode.value)

            try:
                run()
            except Unsatisfiable:  # a negative case of an operation without inputs: nothing to negate
                pass
            except Exception as exc:
                failures.append({"operation": f"{op.method.upper()} {op.path}", "mode": mode.value,
                                 "error": f"generation stopped: {type(exc).__name__}: {str(exc)[:300]}"})
    server_errors = sum(v for k, v in statuses.items() if k >= 500)
    return {"sent": sent, "statuses": {str(k): v for k, v in sorted(statuses.items())}, "server_errors": server_errors,
            "failures": failures[:50], "num_failures": len(failures), "problems": [
                f"{f['operation']} ({f['mode']}): {f.get('problems') or f.get('error')}" for f in failures[:20]]}


def _short(body) -> str:
    try:
        text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(body)
    return text[:300]


# ----- the report ---------------------------------------------------------------------------------------------------


def table(report: dict) -> str:
    rows = []
    load = report.get("load")
    if load:
        rows.append(("load", f"{load['requests']} concurrent streaming chats ({load['distinct_prompts']} prompts, "
                             f"{load['max_tokens']} tokens, after a {load['warmup']}-request warm-up)",
                     f"{load['completed']} completed, {load['refused']} 429/503, {load['error']} errors, "
                     f"{load['broken']} broken; max latency {load['max_latency_s']:.1f} s; "
                     f"{load['equal_to_alone']} equal to alone, {len(load['near_ties'])} near-ties")
                    )
        leaks = load["leaks"]
        rows.append(("leaks after the burst", "KV blocks, draft contexts, queue, running; replica RSS",
                     f"{leaks['kv_blocks_used']:.0f}, {leaks['draft_contexts_live']:.0f}, "
                     f"{leaks['num_requests_waiting']:.0f}, {leaks['num_requests_running']:.0f}; RSS "
                     f"{load['rss_before_bytes'] / 2**20:.0f} -> {load['rss_after_bytes'] / 2**20:.0f} MiB "
                     f"({load['rss_delta']:+.1%})"))
        spec = load["speculation"]
        rows.append(("speculation during load", "drafter='default'",
                     f"enabled {spec['speculation_enabled']:.0f}, drafts {spec['drafts']:.0f}, accepted "
                     f"{spec['accepted_tokens']:.0f}" if spec["speculation_enabled"] else
                     "drafter not available: served without speculation (drafter_error 1)"))
    faults = report.get("faults") or {}
    if "draft_actor_kill" in faults:
        f = faults["draft_actor_kill"]
        rows.append(("fault: draft actor killed", f"{f['requests']} long greedy streams, 2 at a time",
                     f"{f['identical']}/{f['requests']} identical to unfaulted; {f['in_flight_at_kill']} in flight at "
                     f"the kill; fallbacks_total {f['fallbacks_total']:.0f}; speculation resumed "
                     f"{_s(f['resume_after_kill_s'])} after the kill; {f['rebuilt_and_speculated']} requests rebuilt "
                     f"from taps and speculated"))
    if "disconnect" in faults:
        f = faults["disconnect"]
        rows.append(("fault: client socket closed mid-stream", f"max_tokens {f['max_tokens']}",
                     f"aborted after {f['tokens_generated']} tokens; KV and context freed "
                     f"{f['freed_after_close_s'] * 1000:.0f} ms after the close"))
    if "kv_exhaustion" in faults:
        f = faults["kv_exhaustion"]
        rows.append(("fault: KV exhaustion", f"{f['requests']} requests needing {f['demand_tokens']} tokens, cache "
                                             f"{f['cache_tokens']}",
                     f"{f['completed']}/{f['requests']} completed, identical; {f['preemptions']} preemptions"))
    if "broken_drafter" in faults:
        f = faults["broken_drafter"]
        rows.append(("fault: broken drafter folder", "replica start-up",
                     f"serves without speculation (drafter_error {f['gauges']['drafter_error']:.0f}, "
                     f"speculation_enabled {f['gauges']['speculation_enabled']:.0f}), {f['answers']} answers, "
                     f"replicas {f['replica_states']}"))
    if "replica_kill" in faults:
        f = faults["replica_kill"]
        rows.append(("fault: LLM replica killed", f"{f['in_flight_streams']} streams + 1 plain request in flight",
                     f"{f['streams_with_error_event']} error events, plain request {f['non_streaming_status']}; "
                     f"recovered in {_s(f['recovery_s'])}"))
    fz = report.get("fuzz")
    if fz:
        rows.append(("fuzz: schemathesis", f"{fz['sent']} generated requests",
                     f"{fz['server_errors']} 5xx, {fz['num_failures']} check failures; statuses {fz['statuses']}"))
    problems = sum(len(section.get("problems", [])) for section in
                   [load or {}, fz or {}, *faults.values()])
    rows.append(("problems found", "", str(problems)))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = [f"| {'check':<{w0}} | {'load / injected':<{w1}} | result |", f"|{'-' * (w0 + 2)}|{'-' * (w1 + 2)}|---|"]
    lines += [f"| {a:<{w0}} | {b:<{w1}} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def _s(v) -> str:
    return "n/a" if v is None else f"{v:.1f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="load,faults,fuzz")
    ap.add_argument("--burst", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=256)
    ap.add_argument("--distinct", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--fuzz-examples", type=int, default=150, help="per operation and mode (positive, negative)")
    ap.add_argument("--seed", type=int, default=None, help="fuzz seed (default: random)")
    ap.add_argument("--out", default=str(RESULTS / "reliability.json"))
    args = ap.parse_args()
    only = set(args.only.split(","))
    import torch

    torch.set_num_threads(1)
    report: dict = {"config": vars(args), "cpus": os.cpu_count(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    t_all = time.perf_counter()
    with local_serve() as port:
        if "load" in only:
            cfg = load_config()
            app = run_app(cfg, port, route_prefix="/load")
            report["load"] = run_load(app, AloneReference(cfg.engine), args.burst, args.distinct, args.max_tokens,
                                      args.warmup)
            from ray import serve

            serve.delete(app.name)
        tmp = Path(tempfile.mkdtemp(prefix="reliability-"))
        if "faults" in only:
            target, drafter = tiny_models(tmp / "small-vocab")
        if "faults" in only:
            faults = report["faults"] = {}
            app = run_app(faults_config(target, drafter), port, route_prefix="/faults")
            faults["draft_actor_kill"] = check_draft_actor_kill(app, target)
            faults["disconnect"] = check_disconnect(app)
            faults["kv_exhaustion"] = check_kv_exhaustion(app, target)
            broken = run_app(faults_config(target, broken_drafter(tmp / "broken", drafter)), port,
                             route_prefix="/broken")
            faults["broken_drafter"] = check_broken_drafter(broken)
            faults["replica_kill"] = check_replica_kill(app)
        if "fuzz" in only:
            from deployments.config import RequestLimits

            target, drafter = tiny_models(tmp / "full-vocab", vocab_size=None, max_positions=1024)
            cfg = faults_config(target, drafter, kv_gb=0.02, max_num_seqs=16,
                                limits=RequestLimits(max_tokens=16, default_chat_max_tokens=16, max_n=4,
                                                     max_choices=8, max_body_bytes=256 * 1024))
            app = run_app(cfg, port, route_prefix="/fuzz")
            report["fuzz"] = fuzz(app, args.fuzz_examples, args.seed)
    report["wall_s"] = time.perf_counter() - t_all
    text = table(report)
    print(text)
    report["table"] = text
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
