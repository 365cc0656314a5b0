"""Faults end to end through HTTP (bench/reliability.py has the harness): nothing lost, nothing leaked.

Tiny random models in float64 (greedy answers are exact, so "identical to an unfaulted run" is checked token for
token), a 512-token vocabulary (cheap draft rounds; prompts are token ids), a tiny random drafter in the replica's
co-located draft actor with `fixed:3` speculation (drafts every step), a small KV cache, fast health checks. One
module-scoped Ray cluster with two apps, `/` and `/degraded`; the checks run in the order below, the replica kill
last. The KV-exhaustion check also guards a leak this suite found: draft contexts released while the proxy
re-checked the actor after a failed draft round were dropped (the proxy now keeps them until a call reaches the
actor).

- The draft actor is killed mid-generation (ray.kill, Ray restarts it): the in-flight requests fall back to plain
  decoding and finish identical to the unfaulted run; the actor comes back as a new incarnation, requests that
  generated during the outage get their contexts rebuilt from the engine's taps and speculate again;
  dspark:draft_fallbacks_total counts the fallback.
- A client closes its socket mid-stream: the request is aborted, its KV blocks and draft context freed.
- KV exhaustion: more KV demand than the cache holds is preempted or queued, and every request completes.
- A broken drafter folder (the `/degraded` app): that replica serves without speculation, says so (log,
  dspark:drafter_error 1, dspark:speculation_enabled 0) and does not crash-loop.
- Overload by one client (the `/degraded` app also has a rate limit keyed by API key): past its burst a client
  gets 429 with Retry-After, before any stream starts; other clients and the other routes are unaffected.
- The LLM replica is killed: in-flight streams end with an error event then [DONE], a non-streaming request with a
  5xx OpenAI error; Serve replaces the replica and new requests succeed within a bounded time (measured).
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest

from bench import reliability as rel
from deployments.config import RateLimitOptions
from deployments.launch import run_app

pytestmark = pytest.mark.slow

RATE = RateLimitOptions(requests_per_s=0.05, burst=3, key="api_key")  # one request per 20 s after the burst


@pytest.fixture(scope="module")
def env(serve_port, tmp_path_factory):
    folder = tmp_path_factory.mktemp("faults")
    target, drafter = rel.tiny_models(folder)
    broken = rel.broken_drafter(folder / "broken-drafter", drafter)
    app = run_app(rel.faults_config(target, drafter), serve_port)
    degraded = run_app(rel.faults_config(target, broken, rate_limit=RATE), serve_port, route_prefix="/degraded")
    return SimpleNamespace(port=serve_port, app=app, degraded=degraded, target=target, drafter=drafter)


def report(record_property, name: str, result: dict) -> None:
    print(name, json.dumps(result, default=str))
    for key, value in result.items():
        if isinstance(value, (int, float, str)) or value is None:
            record_property(f"{name}.{key}", value)


def test_draft_actor_killed_mid_generation_falls_back_then_resumes(env, record_property):
    result = rel.check_draft_actor_kill(env.app, env.target, max_tokens=700, concurrency=3, timeout_s=150)
    report(record_property, "draft_actor_kill", result)
    assert result["problems"] == [], result["problems"]
    assert result["identical"] == result["completed"] == result["requests"] >= 3
    assert result["in_flight_at_kill"] >= 1 and result["rebuilt_and_speculated"] >= 1
    assert result["fallbacks_total"] >= 1


def test_client_disconnect_aborts_and_frees_kv_and_context(env, record_property):
    result = rel.check_disconnect(env.app, max_tokens=2000)
    report(record_property, "disconnect", result)
    assert result["problems"] == [], result["problems"]
    assert result["tokens_generated"] < result["max_tokens"] // 2
    assert result["freed_after_close_s"] < 10
    assert not any(result["leaks"].values())


def test_kv_exhaustion_preempts_or_queues_and_everything_completes(env, record_property):
    result = rel.check_kv_exhaustion(env.app, env.target, n=8, prompt_len=200, max_tokens=400)
    report(record_property, "kv_exhaustion", result)
    assert result["problems"] == [], result["problems"]
    assert result["completed"] == result["requests"] and result["demand_tokens"] > result["cache_tokens"]
    assert not any(result["leaks"].values())


def test_broken_drafter_serves_without_speculation_and_does_not_crash_loop(env, record_property):
    result = rel.check_broken_drafter(env.degraded, watch_s=5)
    report(record_property, "broken_drafter", result)
    assert result["problems"] == [], result["problems"]
    assert "could not start" in result["drafter_error"] and result["answers"] >= 3


def test_rate_limit_429_with_retry_after_per_api_key(env):
    body = rel.completion_body(rel.prompt_ids(1), 1, stream=False)
    key_a = {"Authorization": "Bearer key-a"}
    with httpx.Client(base_url=env.degraded.base, timeout=60) as c:
        assert [c.post("/v1/completions", json=body, headers=key_a).status_code
                for _ in range(RATE.burst)] == [200] * RATE.burst
        r = c.post("/v1/completions", json=body, headers=key_a)
        assert r.status_code == 429 and rel.error_shape_ok(r.json(), 429), r.text
        err = r.json()["error"]
        assert err["type"] == "RateLimitError" and "rate limit" in err["message"]
        assert 1 <= int(r.headers["retry-after"]) <= 1 / RATE.requests_per_s + 1
        stream = c.post("/v1/chat/completions", headers=key_a, json={
            "messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "stream": True})
        assert stream.status_code == 429 and rel.error_shape_ok(stream.json(), 429)  # before any stream starts
        # Other keys and keyless clients (keyed by address) have their own buckets; other routes are not limited.
        assert c.post("/v1/completions", json=body, headers={"Authorization": "Bearer key-b"}).status_code == 200
        assert c.post("/v1/completions", json=body).status_code == 200
        assert c.get("/health").status_code == 200 and c.get("/v1/models").status_code == 200
    samples = rel.wait_scrape(env.degraded, lambda s: rel.metric(
        s, "dspark:http_requests_total", route="/v1/completions", status="429") >= 1, 15, "429s counted")
    assert rel.metric(samples, "dspark:http_requests_total", route="/v1/chat/completions", status="429") >= 1
    # The main app has no rate limit (the default): the same burst passes.
    with httpx.Client(base_url=env.app.base, timeout=60) as c:
        assert {c.post("/v1/completions", json=body, headers=key_a).status_code
                for _ in range(RATE.burst + 2)} == {200}


def test_replica_killed_in_flight_requests_get_clear_errors_and_serve_recovers(env, record_property):
    result = rel.check_replica_kill(env.app, max_tokens=2000, n_streams=2, recovery_timeout_s=180)
    report(record_property, "replica_kill", result)
    assert result["problems"] == [], result["problems"]
    assert result["streams_with_error_event"] == result["in_flight_streams"] == 2
    assert result["non_streaming_status"] >= 500 and result["recovery_s"] < 180
