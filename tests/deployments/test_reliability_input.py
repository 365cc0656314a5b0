"""Hostile input and rate limits (bench/reliability.py has the fuzz harness).

- /openapi.json describes the real request bodies (the pydantic request models narrowed by the deployment's
  limits, the served model, the error shape of every 4xx/5xx).
- schemathesis fuzzes every operation from that document, a few hundred generated requests (positive and negative,
  derandomized so CI sends the same ones every run): no 5xx, every error a JSON body in OpenAI's shape with the
  documented statuses and content types, schema-invalid requests rejected.
- By hand (beyond tests/deployments/test_serve.py's BAD list): invalid UTF-8, a 10 MB body (declared and chunked), deeply nested
  JSON, lone surrogates, prompts of 0, 1 and max-context tokens, max_tokens of 0, 1 and 10^9, a 1000-string stop
  list, NaN and infinite temperatures, negative seeds, unknown fields, n beyond its limit, a top_k past int64: each
  gets a clear 4xx or a correct answer (greedy answers equal the in-process engine), and the server keeps serving.
- Rate limit (LLMServingConfig.rate_limit): the token buckets and client keys here; over HTTP in
  tests/deployments/test_reliability_faults.py.

One module-scoped Ray cluster with one app of a tiny random model (the default model's tokenizer, float64,
adaptive speculation with a tiny drafter in the draft actor) and tight limits.
"""
from __future__ import annotations

import json
import socket
from types import SimpleNamespace

import httpx
import pytest

from bench import reliability as rel
from deployments.config import LLMServingConfig, RateLimitOptions, RequestLimits
from deployments.launch import run_app
from deployments.ratelimit import TokenBuckets, client_key, retry_after_header

LIMITS = RequestLimits(max_tokens=16, default_chat_max_tokens=16, max_n=4, max_choices=8, max_stop=4,
                       max_body_bytes=256 * 1024)
C, CH = "/v1/completions", "/v1/chat/completions"
USER = [{"role": "user", "content": "Hello"}]


# ----- without a cluster -----------------------------------------------------------------------------------------


def test_token_buckets_refill_refuse_and_stay_bounded():
    b = TokenBuckets(rate=2.0, burst=3, max_clients=2)
    assert [b.take("a", now=10.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take("a", now=10.0) == pytest.approx(0.5)  # empty: one token back in 1/rate s
    assert b.take("a", now=10.25) == pytest.approx(0.25)  # a refusal takes nothing
    assert b.take("a", now=10.5) == 0.0
    assert b.take("b", now=10.5) == 0.0 and b.take("c", now=10.5) == 0.0
    assert len(b) == 2  # "a" (least recently seen) dropped
    assert b.take("a", now=10.5) == 0.0  # ... and comes back with a full bucket
    assert b.take("a", now=1000.0) == 0.0 and b.take("a", now=1000.0) == 0.0  # refill caps at the burst
    assert retry_after_header(0.01) == "1" and retry_after_header(2.2) == "3"
    with pytest.raises(ValueError):
        TokenBuckets(rate=0, burst=1)


def test_client_keys():
    h = {"authorization": "Bearer sk-secret", "x-forwarded-for": "10.1.2.3, 127.0.0.1"}
    assert client_key(h, "127.0.0.1", "ip", False) == "ip:127.0.0.1"
    assert client_key(h, "127.0.0.1", "ip", True) == "ip:10.1.2.3"
    key = client_key(h, "127.0.0.1", "api_key", False)
    assert key.startswith("key:") and "secret" not in key
    assert key != client_key({"authorization": "Bearer other"}, "127.0.0.1", "api_key", False)
    assert client_key({}, "127.0.0.1", "api_key", False) == "ip:127.0.0.1"  # no key: the address


def test_rate_limit_config_defaults_off_and_loads_from_the_serve_yaml():
    import yaml

    assert not LLMServingConfig().rate_limit.enabled
    args = yaml.safe_load((rel.ROOT / "configs" / "serve.yaml").read_text())["applications"][0]["args"]
    config = LLMServingConfig.model_validate(args)
    assert config.rate_limit == RateLimitOptions() and not config.rate_limit.enabled
    args["rate_limit"] = {"requests_per_s": 5, "burst": 10, "key": "api_key"}
    assert LLMServingConfig.model_validate(args).rate_limit.enabled
    with pytest.raises(ValueError):
        RateLimitOptions(requests_per_s=-1)


# ----- the apps ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env(serve_port, tmp_path_factory):
    folder = tmp_path_factory.mktemp("input")
    target, drafter = rel.tiny_models(folder, vocab_size=None, max_positions=1024)
    config = rel.faults_config(target, drafter, kv_gb=0.02, max_num_seqs=16, limits=LIMITS)
    config.engine.speculation = "adaptive"
    return SimpleNamespace(app=run_app(config, serve_port), port=serve_port, target=target, engine_cfg=config.engine)


@pytest.fixture(scope="module")
def client(env):
    with httpx.Client(base_url=env.app.base, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def reference(env):
    """Greedy answers of the in-process engine (float64, same config): what a correct 200 must say."""
    from engine import LLMEngine, SamplingParams

    engine = LLMEngine(env.engine_cfg)
    counter = iter(range(10**9))

    def run(prompt, **params):
        rid = f"ref{next(counter)}"
        engine.add_request(rid, prompt, SamplingParams(**params))
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished and out.request_id == rid:
                    return out

    run.engine = engine
    return run


def assert_error(r, status: int):
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json")
    assert rel.error_shape_ok(r.json(), status), r.text[:300]


def assert_serving(client):
    ok = client.post(C, json={"prompt": "hi", "max_tokens": 2, "temperature": 0})
    assert ok.status_code == 200, ok.text


# ----- OpenAPI and the fuzzer -----------------------------------------------------------------------------------


def test_openapi_describes_the_real_request_bodies(env, client):
    doc = client.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    paths = doc["paths"]
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"} <= set(paths)
    schemas = doc["components"]["schemas"]
    for path, name in ((C, "CompletionRequest"), (CH, "ChatCompletionRequest")):
        op = paths[path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"] == {
            "$ref": f"#/components/schemas/{name}"}
        assert set(op["responses"]) >= {"200", "400", "413", "429", "503"}
        assert op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("ErrorResponse")
        props = schemas[name]["properties"]
        assert props["n"]["maximum"] == LIMITS.max_n
        assert {"type": "string", "enum": ["tiny"]} in props["model"]["anyOf"]
        assert any(b.get("maxItems") == LIMITS.max_stop for b in props["stop"]["anyOf"])
        assert any(b.get("maximum") == LIMITS.max_tokens for b in props["max_tokens"]["anyOf"])
    assert schemas["ChatCompletionRequest"]["required"] == ["messages"]
    assert schemas["CompletionRequest"]["required"] == ["prompt"]
    assert set(schemas["ErrorInfo"]["required"]) == {"message", "type", "code"}
    assert client.get("/docs").status_code == 404  # no interactive docs; the document is the API


def test_schemathesis_fuzz_finds_no_5xx_and_only_openai_errors(env, record_property):
    result = rel.fuzz(env.app, examples=80, seed=0, time_limit_s=420)
    print(json.dumps({k: v for k, v in result.items() if k != "failures"}))
    for f in result["failures"][:10]:
        print(f)
    record_property("fuzz_sent", result["sent"])
    record_property("fuzz_statuses", json.dumps(result["statuses"]))
    assert result["sent"] >= 300
    assert result["server_errors"] == 0, result["statuses"]
    assert result["num_failures"] == 0, result["problems"]
    assert result["statuses"].get("200", 0) >= 20  # the generated requests also reached the engine


# ----- hostile input by hand --------------------------------------------------------------------------------------


def nested(depth: int) -> bytes:
    return b'{"prompt": "hi", "max_tokens": 1, "extra": ' + b"[" * depth + b"]" * depth + b"}"


HOSTILE = [
    ("invalid UTF-8 in a string", C, {"content": b'{"prompt": "caf\xc3\x28 \xff\xfe", "max_tokens": 1}'}, 400),
    ("invalid UTF-8 outside strings", CH, {"content": b'\xff\xfe{"messages": []}'}, 400),
    ("a lone surrogate escape", C, {"content": b'{"prompt": "\\ud800", "max_tokens": 1}'}, (200, 400)),
    ("a lone surrogate in the model name", C, {"content": b'{"model": "\\udfff", "prompt": "hi"}'}, (400, 404)),
    ("deeply nested JSON", C, {"content": nested(100_000)}, 400),
    ("nested JSON at depth 5000 in a message", CH,
     {"content": b'{"messages": [{"role": "user", "content": ' + b"[" * 5000 + b"]" * 5000 + b"}]}"}, 400),
    ("empty body", C, {"content": b""}, 400),
    ("a batch with an empty prompt", C, {"json": {"prompt": [[5, 6], []], "max_tokens": 1}}, 400),
    ("prompt of max-context tokens", C, {"json": {"prompt": [5] * 1024, "max_tokens": 1}}, 400),
    ("max_completion_tokens 0", CH, {"json": {"messages": USER, "max_completion_tokens": 0}}, 400),
    ("max_tokens 10^9", CH, {"json": {"messages": USER, "max_tokens": 10**9, "stream": True}}, 400),
    ("max_tokens 10^9 completion", C, {"json": {"prompt": "hi", "max_tokens": 10**9}}, 400),
    ("a stop list of 1000 strings", C, {"json": {"prompt": "hi", "stop": [f"s{i}" for i in range(1000)]}}, 400),
    ("a stop string too long", CH, {"json": {"messages": USER, "stop": "x" * 10_000}}, 400),
    ("10000 stop_token_ids", C, {"json": {"prompt": "hi", "stop_token_ids": list(range(10_000))}}, 400),
    ("NaN temperature", CH, {"content": b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}'}, 400),
    ("Infinity temperature", C, {"content": b'{"prompt": "hi", "temperature": Infinity}'}, 400),
    ("-Infinity temperature", C, {"content": b'{"prompt": "hi", "temperature": -Infinity}'}, 400),
    ("temperature 1e999 (overflows to inf)", CH,
     {"content": b'{"messages": [{"role": "user", "content": "x"}], "temperature": 1e999}'}, 400),
    ("seed below int64", C, {"json": {"prompt": "hi", "seed": -(2**63) - 1}}, 400),
    ("seed 10^40", C, {"json": {"prompt": "hi", "seed": 10**40}}, 400),
    ("top_k past int64", C, {"json": {"prompt": "hi", "top_k": 2**64, "temperature": 1}}, 400),
    ("n 10^30", C, {"json": {"prompt": "hi", "n": 10**30}}, 400),
    ("n one past the limit", CH, {"json": {"messages": USER, "n": LIMITS.max_n + 1}}, 400),
    ("prompts x n past max_choices", C, {"json": {"prompt": ["a", "b", "c"], "n": 3}}, 400),
    ("10000 prompts", C, {"json": {"prompt": ["a"] * 10_000}}, 400),
    ("too many messages", CH, {"json": {"messages": USER * 600}}, 400),
    ("a huge integer token id", C, {"json": {"prompt": [10**30]}}, 400),
    ("a negative token id", C, {"json": {"prompt": [-1]}}, 400),
    ("a boolean token id", C, {"json": {"prompt": [True, 5]}}, 400),
    ("GET on a POST route", None, {}, 405),
]


@pytest.mark.parametrize("name,path,kwargs,status", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_input_gets_a_clear_4xx_or_a_correct_answer(client, name, path, kwargs, status):
    if path is None:
        r = client.get(C)
    else:
        r = client.post(path, headers={"content-type": "application/json"}, **kwargs)
    statuses = status if isinstance(status, tuple) else (status,)
    assert r.status_code in statuses, (name, r.status_code, r.text[:300])
    if r.status_code >= 400:
        assert_error(r, r.status_code)
    assert_serving(client)


def test_a_10_mb_body_is_refused_before_it_is_parsed(env, client):
    big = b'{"prompt": "' + b"x" * (10 * 2**20) + b'"}'
    assert_error(client.post(C, content=big, headers={"content-type": "application/json"}), 413)

    def chunks():  # no Content-Length: refused while it streams in
        yield b'{"prompt": "'
        for _ in range(40):
            yield b"y" * 2**18
        yield b'"}'

    assert_error(client.post(C, content=chunks(), headers={"content-type": "application/json"}), 413)
    # A Content-Length that is not a plain number (non-ASCII digits) is not a crash either.
    with socket.create_connection(("127.0.0.1", env.port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: \xb2\r\n\r\n{}")
        head = s.recv(4096).split(b"\r\n", 1)[0]
    assert head.startswith(b"HTTP/1.1 4"), head
    assert_serving(client)


def test_boundary_prompts_and_max_tokens_get_correct_answers(client, reference):
    max_len = client.get("/v1/models").json()["data"][0]["max_model_len"]
    for prompt, max_tokens in (([7], 1), ([7], LIMITS.max_tokens), ([9] * (max_len - 1), 1), ("x", 1)):
        r = client.post(C, json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, (len(prompt), r.text[:300])
        want = reference(prompt, max_tokens=max_tokens, ignore_eos=True)
        body = r.json()
        assert body["choices"][0]["text"] == want.text
        assert body["usage"]["completion_tokens"] == max_tokens == len(want.token_ids)
    # One past the context: a clear 400 that names the limit.
    r = client.post(C, json={"prompt": [9] * max_len, "max_tokens": 1})
    assert_error(r, 400)
    assert str(max_len - 1) in r.json()["error"]["message"]
    # max_tokens 1 in a stream: one token, a finish reason, [DONE].
    with client.stream("POST", CH, json={"messages": USER, "max_tokens": 1, "temperature": 0, "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and '"finish_reason":"length"' in lines[-2]


def test_negative_seeds_and_unknown_fields_get_correct_answers(client, reference):
    body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0.9, "seed": -1, "ignore_eos": True}
    a = client.post(C, json=body)
    b = client.post(C, json=body)
    assert a.status_code == b.status_code == 200, a.text
    assert a.json()["choices"][0]["text"] == b.json()["choices"][0]["text"]  # a negative seed is a seed
    lowest = client.post(C, json={**body, "seed": -(2**63)})
    assert lowest.status_code == 200, lowest.text
    want = reference("Once upon a time", max_tokens=8, ignore_eos=True)
    odd = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
           "frobnicate": {"deep": [1, 2, {"x": None}]}, "stream_options": None, "functions": [], "store": True,
           "metadata": {"k": "v"}, "service_tier": "auto", "parallel_tool_calls": False}
    r = client.post(C, json=odd)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == want.text, r.text
    messages = [{"role": "user", "content": "Hi", "unknown": 1, "refusal": None}]
    r = client.post(CH, json={"messages": messages, "max_tokens": 4, "temperature": 0, "mystery": True})
    assert r.status_code == 200, r.text
    ids = list(reference.engine.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}],
                                                              add_generation_prompt=True, tokenize=True,
                                                              return_dict=True)["input_ids"])
    assert r.json()["choices"][0]["message"]["content"] == reference(ids, max_tokens=4).text
