"""The Ray Serve application over real HTTP: OpenAI completions and chat (plain, SSE, the official client), greedy
answers equal to the in-process engine, speculative metrics, bad input -> 4xx in OpenAI's error shape, a full queue
-> 429, and client disconnects freeing the engine's KV blocks and draft contexts.

One module-scoped local Ray and Serve (tests/conftest.py's serve_port) running one app per layout in turn (the LLM
replica behind an ingress deployment, or serving HTTP itself), tiny random models (float64, so greedy comparisons are
exact) and a tiny random drafter in a co-located draft actor with `fixed:3` speculation, so speculation really runs.
"""
from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from deployments.config import LLMServingConfig, RequestLimits
from deployments.launch import run_app
from engine import EngineConfig, LLMEngine, SamplingParams
from tests.helpers import make_tiny_model
from tests.helpers import make_tiny_drafter

httpx = pytest.importorskip("httpx")
pytest.importorskip("ray")
pytestmark = pytest.mark.slow

SPEC_KEYS = {"mean_acceptance_length", "acceptance_rate", "num_spec_steps", "num_draft_tokens", "num_accepted_tokens"}
LONG = {"max_tokens": 900, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module", params=["in_replica", "separate"])
def server(request, serve_port, tmp_path_factory, default_tokenizer):
    """Both layouts: an ingress deployment in front of the LLM replica (the default), and the replica serving HTTP
    itself. Each layout's app is deleted before the next one takes the route "/"."""
    from ray import serve

    folder = tmp_path_factory.mktemp("serve")
    target = make_tiny_model("llama", folder / "target", default_tokenizer)
    drafter = make_tiny_drafter(folder / "drafter", len(default_tokenizer))
    engine_cfg = EngineConfig(model=str(target), dtype="float64", device="cpu", kv_cache_memory_gb=0.05,
                              drafter=str(drafter), speculation="fixed:3", max_num_seqs=2, max_waiting=4,
                              max_num_batched_tokens=128)
    config = LLMServingConfig(engine=engine_cfg, served_model_name="tiny", drafter_mode="actor",
                              ingress_mode=request.param,
                              limits=RequestLimits(max_body_bytes=64 * 1024, max_n=4, max_stop=4, max_tokens=2048))
    app = run_app(config, serve_port)
    try:
        yield SimpleNamespace(base=app.base, config=config, engine_cfg=engine_cfg, tokenizer=default_tokenizer)
    finally:
        serve.delete(app.name)


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.base, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def reference(server):
    """The in-process engine with the same config: what greedy HTTP answers must equal."""
    engine = LLMEngine(server.engine_cfg)
    assert engine.speculator is not None
    counter = iter(range(10**9))

    def run(prompt, params: SamplingParams):
        rid = f"ref{next(counter)}"
        engine.add_request(rid, prompt, params)
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished and out.request_id == rid:
                    return out

    return run


def chat_ids(tokenizer, messages):
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"])


def sse_events(response) -> list:
    """The `data:` payloads of an SSE response, parsed; the final [DONE] stays a string."""
    assert response.headers["content-type"].startswith("text/event-stream")
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
        else:
            assert line == "", line
    return events


def wait_idle(client, timeout=20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = client.get("/stats").json()
        idle = (stats["num_running"], stats["num_waiting"], stats["in_flight"], stats["kv_blocks_used"]) == (0, 0, 0, 0)
        if idle and stats.get("draft_actor", {}).get("live_contexts") == 0:
            return stats
        assert time.monotonic() < deadline, f"the engine did not become idle: {stats}"
        time.sleep(0.1)


# ----- happy paths --------------------------------------------------------------------------------------------


def test_routes_models_health(client):
    assert client.get("/health").json() == {"status": "ok"}
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny"]
    assert models["data"][0]["max_model_len"] == 1024


def test_metrics_route_has_the_replica_and_the_http_routes(client):
    """/metrics has the engine replica's samples and the HTTP routes' counters in either layout (in_replica: one
    snapshot per replica holding both)."""
    from prometheus_client.parser import text_string_to_metric_families

    assert client.get("/health").status_code == 200
    deadline = time.monotonic() + 20
    while True:
        r = client.get("/metrics")
        assert r.status_code == 200
        samples = [(s.name, s.labels, s.value) for f in text_string_to_metric_families(r.text) for s in f.samples]
        engines = {lab["replica"] for n, lab, _ in samples if n == "dspark:speculation_enabled"}
        health = sum(v for n, lab, v in samples if n == "dspark:http_requests_total" and lab.get("route") == "/health")
        if engines and health >= 1:
            break
        assert time.monotonic() < deadline, f"/metrics lacks the replica or the HTTP counters: {engines}, {health}"
        time.sleep(0.3)
    assert len(engines) == 1 and all(v == 1 for n, _, v in samples if n == "dspark:speculation_enabled")


@pytest.mark.parametrize("prompt", ["Hello there", "The capital of France is", [5, 17, 300, 42]])
def test_completion_greedy_equals_in_process_engine(client, reference, prompt):
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 24,
                                             "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    want = reference(prompt, SamplingParams(max_tokens=24, ignore_eos=True))
    assert body["object"] == "text_completion" and body["model"] == "tiny"
    assert body["choices"][0]["text"] == want.text and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": len(want.prompt_token_ids), "completion_tokens": 24,
                             "total_tokens": len(want.prompt_token_ids) + 24,
                             "prompt_tokens_details": {"cached_tokens": 0}}  # shorter than a KV block
    sd = body["metrics"]["speculative_decoding"]
    assert set(sd) == SPEC_KEYS and sd["num_spec_steps"] > 0 and sd["num_draft_tokens"] > 0
    assert sd["num_spec_steps"] == want.metrics["num_spec_steps"]


def test_a_repeated_prompt_is_served_from_the_prefix_cache(client, reference):
    """The second request for a long prompt takes its full KV blocks from the cache (usage says how many tokens,
    as OpenAI's cached_tokens), and its answer is still the engine's own."""
    prompt = list(range(100, 160))  # 60 tokens: 3 full blocks of 16, the last token always computed
    want = reference(prompt, SamplingParams(max_tokens=8, ignore_eos=True))
    bodies = []
    for _ in range(2):
        r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0,
                                                 "ignore_eos": True})
        assert r.status_code == 200, r.text
        bodies.append(r.json())
    assert bodies[1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 48}
    assert [b["choices"][0]["text"] for b in bodies] == [want.text] * 2


def test_penalties_reach_the_engine(client, reference):
    """OpenAI's presence/frequency penalties, vLLM's repetition penalty and logit_bias (string token ids) give what
    the in-process engine gives with the same penalties, greedy, through speculation (lossless under penalties is
    tested in tests/engine/test_speculative.py)."""
    prompt = "Once upon a time"
    penalties = {"presence_penalty": 1.2, "frequency_penalty": 0.5, "repetition_penalty": 1.3,
                 "logit_bias": {"13": 4.0, "30": -100}}
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
                                             **penalties})
    assert r.status_code == 200, r.text
    want = reference(prompt, SamplingParams(max_tokens=24, ignore_eos=True, **{
        **penalties, "logit_bias": {13: 4.0, 30: -100.0}}))
    plain = reference(prompt, SamplingParams(max_tokens=24, ignore_eos=True))
    assert r.json()["choices"][0]["text"] == want.text != plain.text
    assert 30 not in want.token_ids


def test_chat_greedy_equals_in_process_engine(server, client, reference):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}]
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_completion_tokens": 20,
                                                  "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    want = reference(chat_ids(server.tokenizer, messages), SamplingParams(max_tokens=20))
    choice = body["choices"][0]
    assert body["object"] == "chat.completion"
    assert choice["message"] == {"role": "assistant", "content": want.text}
    assert choice["finish_reason"] == want.finish_reason
    assert body["usage"]["completion_tokens"] == len(want.token_ids)
    assert body["metrics"]["speculative_decoding"]["num_spec_steps"] > 0


def test_streaming_completion_and_chat_sse(server, client, reference):
    want = reference("Hello there", SamplingParams(max_tokens=16, ignore_eos=True))
    req = {"prompt": "Hello there", "max_tokens": 16, "temperature": 0, "ignore_eos": True, "stream": True}
    with client.stream("POST", "/v1/completions", json=req) as r:
        assert r.status_code == 200
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "text_completion" for c in chunks) and len(chunks) > 1
    assert "".join(c["choices"][0]["text"] for c in chunks) == want.text
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert set(chunks[-1]["metrics"]["speculative_decoding"]) == SPEC_KEYS
    assert all("usage" not in c for c in chunks)

    messages = [{"role": "user", "content": "Hi"}]
    want = reference(chat_ids(server.tokenizer, messages), SamplingParams(max_tokens=12))
    req = {"messages": messages, "max_tokens": 12, "temperature": 0, "stream": True,
           "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=req) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    *chunks, usage = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == want.text
    assert chunks[-1]["choices"][0]["finish_reason"] == want.finish_reason
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(want.token_ids)
    assert usage["usage"]["prompt_tokens"] == len(want.prompt_token_ids)
    assert usage["metrics"]["speculative_decoding"]["num_spec_steps"] > 0


def test_official_openai_client(server, reference):
    openai = pytest.importorskip("openai")
    oc = openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0, timeout=120)
    assert [m.id for m in oc.models.list()] == ["tiny"]
    want = reference("Once upon a time", SamplingParams(max_tokens=10, ignore_eos=True))
    out = oc.completions.create(model="tiny", prompt="Once upon a time", max_tokens=10, temperature=0,
                                extra_body={"ignore_eos": True})
    assert out.choices[0].text == want.text and out.usage.completion_tokens == 10
    assert out.model_extra["metrics"]["speculative_decoding"]["num_spec_steps"] > 0
    # Speculation per request: `off` verifies nothing and answers the same.
    out = oc.completions.create(model="tiny", prompt="Once upon a time", max_tokens=10, temperature=0,
                                extra_body={"ignore_eos": True, "speculation": "off"})
    assert out.choices[0].text == want.text
    assert out.model_extra["metrics"]["speculative_decoding"]["num_spec_steps"] == 0

    messages = [{"role": "user", "content": "Name a colour."}]
    want = reference(chat_ids(server.tokenizer, messages), SamplingParams(max_tokens=12))
    chat = oc.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    assert chat.choices[0].message.content == want.text
    stream = oc.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0, stream=True,
                                        stream_options={"include_usage": True})
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage:
            usage = chunk.usage
    assert text == want.text and usage.completion_tokens == len(want.token_ids)


def test_n_batch_prompts_and_seeds(client):
    req = {"prompt": ["Hello", "Goodbye"], "n": 2, "max_tokens": 8, "temperature": 0.9, "seed": 11,
           "ignore_eos": True}
    a = client.post("/v1/completions", json=req).json()
    b = client.post("/v1/completions", json=req).json()
    assert [c["index"] for c in a["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in a["choices"]] == [c["text"] for c in b["choices"]]  # seeded: reproducible
    assert a["choices"][0]["text"] != a["choices"][1]["text"]  # seeds 11 and 12
    single = client.post("/v1/completions", json={**req, "prompt": "Hello", "n": 1}).json()
    assert single["choices"][0]["text"] == a["choices"][0]["text"]
    assert a["usage"]["completion_tokens"] == 32
    # Streaming n=2: both choices arrive, each with its own finish chunk.
    with client.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "n": 2, "max_tokens": 6, "temperature": 0.9,
            "seed": 5, "ignore_eos": True, "stream": True}) as r:
        events = sse_events(r)
    finished = [c["choices"][0]["index"] for c in events[:-1] if c["choices"][0].get("finish_reason")]
    assert sorted(finished) == [0, 1]
    assert "metrics" in events[-2]


def test_logprobs(client):
    r = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 5, "temperature": 0, "logprobs": 2,
                                             "ignore_eos": True}).json()
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 5
    assert "".join(lp["tokens"]) == r["choices"][0]["text"]
    assert all(len(t) == 2 and max(t.values()) == pytest.approx(v) for t, v in zip(lp["top_logprobs"],
                                                                                  lp["token_logprobs"]))
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                                                  "temperature": 0, "logprobs": True, "top_logprobs": 3}).json()
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == r["usage"]["completion_tokens"]
    assert all(len(c["top_logprobs"]) == 3 and c["logprob"] <= 0 for c in content)


# ----- bad input ----------------------------------------------------------------------------------------------

C, CH = "/v1/completions", "/v1/chat/completions"
BAD = [
    ("malformed json", "POST", C, {"content": b'{"prompt": "hi",'}, 400),
    ("json array", "POST", C, {"content": b"[1, 2]"}, 400),
    ("max_tokens string", "POST", C, {"json": {"prompt": "hi", "max_tokens": "ten"}}, 400),
    ("prompt number", "POST", C, {"json": {"prompt": 5}}, 400),
    ("prompt missing", "POST", C, {"json": {"max_tokens": 5}}, 400),
    ("messages string", "POST", CH, {"json": {"messages": "hello"}}, 400),
    ("unknown model", "POST", C, {"json": {"model": "gpt-9", "prompt": "hi"}}, 404),
    ("unknown model chat", "POST", CH, {"json": {"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}},
     404),
    ("negative max_tokens", "POST", C, {"json": {"prompt": "hi", "max_tokens": -5}}, 400),
    ("zero max_tokens", "POST", C, {"json": {"prompt": "hi", "max_tokens": 0}}, 400),
    ("huge max_tokens", "POST", C, {"json": {"prompt": "hi", "max_tokens": 10**12}}, 400),
    ("max_tokens past the context", "POST", C, {"json": {"prompt": "hi", "max_tokens": 2000}}, 400),
    ("prompt ids longer than the context", "POST", C, {"json": {"prompt": [5] * 1500}}, 400),
    ("text prompt longer than the context", "POST", C, {"json": {"prompt": "hello " * 1200}}, 400),
    ("chat longer than the context", "POST", CH,
     {"json": {"messages": [{"role": "user", "content": "hello " * 1200}]}}, 400),
    ("NaN temperature", "POST", C, {"content": b'{"prompt": "hi", "temperature": NaN}'}, 400),
    ("Infinity top_p", "POST", C, {"content": b'{"prompt": "hi", "top_p": Infinity}'}, 400),
    ("temperature too high", "POST", C, {"json": {"prompt": "hi", "temperature": 5}}, 400),
    ("negative temperature", "POST", CH, {"json": {"messages": [{"role": "user", "content": "x"}],
                                                   "temperature": -1}}, 400),
    ("top_p zero", "POST", C, {"json": {"prompt": "hi", "top_p": 0}}, 400),
    ("top_p above one", "POST", C, {"json": {"prompt": "hi", "top_p": 1.5}}, 400),
    ("top_k negative", "POST", C, {"json": {"prompt": "hi", "top_k": -5}}, 400),
    ("invalid speculation", "POST", C, {"json": {"prompt": "hi", "speculation": "fixed:x"}}, 400),
    ("unknown speculation", "POST", CH, {"json": {"messages": [{"role": "user", "content": "x"}],
                                                  "speculation": "turbo"}}, 400),
    ("speculation number", "POST", C, {"json": {"prompt": "hi", "speculation": 3}}, 400),
    ("n too large", "POST", C, {"json": {"prompt": "hi", "n": 99}}, 400),
    ("n zero", "POST", C, {"json": {"prompt": "hi", "n": 0}}, 400),
    ("too many stop strings", "POST", C, {"json": {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}}, 400),
    ("empty stop string", "POST", C, {"json": {"prompt": "hi", "stop": [""]}}, 400),
    ("negative stop token", "POST", C, {"json": {"prompt": "hi", "stop_token_ids": [-1]}}, 400),
    ("token id outside the vocabulary", "POST", C, {"json": {"prompt": [10**7]}}, 400),
    ("empty prompt", "POST", C, {"json": {"prompt": ""}}, 400),
    ("empty prompt list", "POST", C, {"json": {"prompt": []}}, 400),
    ("seed string", "POST", C, {"json": {"prompt": "hi", "seed": "abc"}}, 400),
    ("logprobs too many", "POST", C, {"json": {"prompt": "hi", "logprobs": 100}}, 400),
    ("top_logprobs without logprobs", "POST", CH, {"json": {"messages": [{"role": "user", "content": "x"}],
                                                            "top_logprobs": 2}}, 400),
    ("presence penalty too large", "POST", C, {"json": {"prompt": "hi", "presence_penalty": 2.5}}, 400),
    ("repetition penalty zero", "POST", C, {"json": {"prompt": "hi", "repetition_penalty": 0}}, 400),
    ("repetition penalty denormal", "POST", C, {"json": {"prompt": "hi", "repetition_penalty": 2.2250738585e-313}},
     400),
    ("logit_bias key not a token id", "POST", C, {"json": {"prompt": "hi", "logit_bias": {"a": 1}}}, 400),
    ("logit_bias too large", "POST", C, {"json": {"prompt": "hi", "logit_bias": {"5": 101}}}, 400),
    ("logit_bias outside the vocabulary", "POST", C, {"json": {"prompt": "hi", "logit_bias": {"10000000": 1}}},
     400),
    ("empty messages", "POST", CH, {"json": {"messages": []}}, 400),
    ("bad role", "POST", CH, {"json": {"messages": [{"role": "robot", "content": "x"}]}}, 400),
    ("image content", "POST", CH, {"json": {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}}, 400),
    ("body too large", "POST", C, {"json": {"prompt": "x" * 70_000}}, 413),
    ("bad stream request", "POST", C, {"json": {"prompt": "hi", "stream": True, "temperature": -1}}, 400),
    ("unknown route", "GET", "/v1/nope", {}, 404),
    ("wrong method", "POST", "/v1/models", {"json": {}}, 405),
]


@pytest.mark.parametrize("name,method,path,kwargs,status", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_openai_error_and_server_keeps_serving(client, name, method, path, kwargs, status):
    r = client.request(method, path, **kwargs)
    assert r.status_code == status, (name, r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
    assert err["code"] == status
    ok = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


# ----- load: full queue, disconnects --------------------------------------------------------------------------


def test_full_queue_is_429_and_disconnects_free_everything(client):
    # max_num_seqs 2 and max_waiting 4: six long streams fill the engine, the seventh request is refused.
    wait_idle(client)
    streams = []
    try:
        for i in range(6):
            cm = client.stream("POST", C, json={"prompt": f"stream {i}", "stream": True, **LONG})
            r = cm.__enter__()
            streams.append(cm)
            assert r.status_code == 200, r.read()
        deadline = time.monotonic() + 10
        while (stats := client.get("/stats").json())["num_waiting"] != 4:  # the stats snapshot lags a step
            assert time.monotonic() < deadline, stats
            time.sleep(0.05)
        assert (stats["num_running"], stats["num_waiting"], stats["in_flight"]) == (2, 4, 6), stats
        for path, body in ((C, {"prompt": "one more", **LONG}),
                           (CH, {"messages": [{"role": "user", "content": "x"}], "stream": True, **LONG})):
            r = client.post(path, json=body)
            assert r.status_code == 429, r.text
            assert "queue is full" in r.json()["error"]["message"] and r.json()["error"]["code"] == 429
    finally:
        for cm in streams:  # the clients go away mid-stream
            cm.__exit__(None, None, None)
    stats = wait_idle(client)
    assert stats["requests_finished"] > 0
    ok = client.post(C, json={"prompt": "hi", "max_tokens": 3, "temperature": 0})
    assert ok.status_code == 200
