"""Deterministic mode over HTTP: 64 concurrent streams answer what the same prompts answer one at a time, to the
logprob's last bit, with speculation running (a tiny random float32 target, whose widths the batch-invariant kernels
take, and a tiny drafter in a co-located draft actor)."""
from __future__ import annotations

import asyncio
import json

import pytest

from deployments.config import LLMServingConfig
from deployments.launch import run_app
from engine import EngineConfig
from tests.helpers import make_tiny_drafter, make_tiny_model

httpx = pytest.importorskip("httpx")
pytest.importorskip("ray")
pytestmark = pytest.mark.slow

PARAMS = {"max_tokens": 10, "temperature": 0, "logprobs": 2, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def base(serve_port, tmp_path_factory, default_tokenizer):
    from ray import serve

    folder = tmp_path_factory.mktemp("deterministic")
    target = make_tiny_model("llama", folder / "target", default_tokenizer)
    drafter = make_tiny_drafter(folder / "drafter", len(default_tokenizer))
    engine_cfg = EngineConfig(model=str(target), dtype="float32", device="cpu", kv_cache_memory_gb=0.05,
                              drafter=str(drafter), speculation="fixed:3", max_num_seqs=64,
                              max_num_batched_tokens=256, deterministic=True)
    app = run_app(LLMServingConfig(engine=engine_cfg, served_model_name="tiny", drafter_mode="actor"), serve_port)
    try:
        yield app.base
    finally:
        serve.delete(app.name)


async def stream(client: httpx.AsyncClient, prompt: str) -> list:
    """The streamed choice's (token, logprob, top logprobs) in order."""
    out = []
    async with client.stream("POST", "/v1/completions", json={"prompt": prompt, **PARAMS}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                lp = json.loads(line[6:])["choices"][0].get("logprobs")
                if lp:
                    out += list(zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]))
    return out


def test_64_concurrent_streams_answer_what_each_prompt_answers_alone(base):
    prompts = [f"Request {i}: " + "tell me about the sea and the stars " * (i % 7) for i in range(64)]

    async def run():
        async with httpx.AsyncClient(base_url=base, timeout=300) as client:
            alone = [await stream(client, p) for p in prompts[:8]]
            together = await asyncio.gather(*(stream(client, p) for p in prompts))
            return alone, together

    alone, together = asyncio.run(run())
    assert all(len(a) == PARAMS["max_tokens"] for a in alone)
    assert together[:8] == alone  # tokens and float logprobs, exactly
