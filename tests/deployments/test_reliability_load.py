"""Reliability under load, on the default model with drafter="default" (bench/reliability.py has the harness).

A burst of 256 concurrent streaming greedy chat requests (16 distinct held-out prompts, 16 tokens each) after an
identical warm-up burst (so the memory baseline already holds the caches a burst of that size fills, e.g. oneDNN's
per-shape primitives): every request completes or gets an explicit 429/503, none hangs or is cut short; every completed
answer equals the same request sent alone (an in-process LLMEngine with the replica's config, one request at a time)
or parts from it only at a genuine logit near-tie of the float64 model (the replica runs float32); afterwards
/metrics shows no KV block, draft context, waiting or running request, and the replica's RSS is within 10% of its
level after the warm-up. Speculation with the committed default drafter must have run.
"""
from __future__ import annotations

import json

import httpx
import pytest

from bench import reliability as rel
from deployments.launch import run_app

pytestmark = pytest.mark.slow

BURST, DISTINCT, MAX_TOKENS, WARMUP = 256, 16, 16, 256


@pytest.fixture(scope="module")
def served(serve_port):
    config = rel.load_config()
    return run_app(config, serve_port), config


def test_burst_of_256_streams_loses_nothing_and_leaks_nothing(served, record_property):
    app, config = served
    reference = rel.AloneReference(config.engine)
    report = rel.run_load(app, reference, BURST, DISTINCT, MAX_TOKENS, WARMUP, timeout_s=600)
    for key in ("completed", "refused", "error", "broken", "max_latency_s", "burst_s", "rss_delta"):
        record_property(key, report[key])
    print(json.dumps({k: v for k, v in report.items() if k != "near_ties"}, default=str))
    assert report["problems"] == [], report["problems"]
    assert report["completed"] + report["refused"] == BURST and report["broken"] == report["error"] == 0
    assert report["completed"] > 0
    assert report["equal_to_alone"] + len(report["near_ties"]) == report["completed"]
    assert report["leaks"] == {"kv_blocks_used": 0, "draft_contexts_live": 0, "num_requests_waiting": 0,
                               "num_requests_running": 0}
    assert abs(report["rss_delta"]) <= 0.10

    # Speculation with the committed drafter (a per-request fixed:3 makes sure it drafts, whatever the adaptive
    # controller thinks of this CPU); the answer still equals the alone one.
    messages = rel.load_prompts_for_burst(1)[0]
    ids = reference.prompt_ids(messages)
    want = reference.run(ids, MAX_TOKENS)
    r = httpx.post(f"{app.base}/v1/chat/completions", timeout=120, json={
        "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "speculation": "fixed:3"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"] == want.text
    spec_steps = body["metrics"]["speculative_decoding"]["num_spec_steps"]
    samples = rel.scrape(app)
    assert rel.default_drafter_available()
    assert rel.metric(samples, "dspark:speculation_enabled") == 1
    assert rel.metric(samples, "dspark:drafter_error") == 0
    assert spec_steps > 0 and rel.metric(samples, "vllm:spec_decode_num_drafts_total") > 0
