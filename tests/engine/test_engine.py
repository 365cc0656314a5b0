"""The continuous-batching engine against transformers' own forward and generate."""
from __future__ import annotations

import random

import pytest
import torch

from engine import LLM, LLMEngine, SamplingParams
from engine.config import EngineConfig
from engine.loader import ModelNotFoundError
from tests.helpers import hf_greedy, make_tiny_model

pytestmark = pytest.mark.usefixtures("kernels")  # each test on the CPU kernels and on the torch ops

FAMILIES = ["llama", "mistral", "qwen2", "qwen3"]


def random_prompts(n, vocab, lo=3, hi=40, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


@pytest.fixture(scope="module")
def tiny_engine(tiny_dir, kernels):  # built per kernel path
    return LLMEngine(EngineConfig(model=str(tiny_dir), dtype="float64", device="cpu", kv_cache_memory_gb=0.05,
                                  tap_layers=[0, 2]))


def run_all(engine: LLMEngine, prompts, params) -> list[list[int]]:
    ids = [f"r{i}-{random.random()}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts):
        engine.add_request(rid, p, params)
    done = {}
    while len(done) < len(ids):
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
    return [done[r] for r in ids]


@pytest.mark.parametrize("family", FAMILIES)
def test_forward_and_taps_match_transformers(family, tmp_path, default_tokenizer):
    """Prefill logits and tapped layer outputs equal transformers' forward, for every supported family."""
    from transformers import AutoModelForCausalLM

    extra = {"attention_bias": True} if family == "qwen2" else {}
    if family == "llama":
        extra["tie_word_embeddings"] = True
    path = make_tiny_model(family, tmp_path / family, default_tokenizer, vocab_size=300, **extra)
    taps = [0, 1, 2]  # HF's hidden_states[-1] is after the final norm, so the last layer is not compared here
    engine = LLMEngine(EngineConfig(model=str(path), dtype="float64", device="cpu", kv_cache_memory_gb=0.01,
                                    tap_layers=taps))
    prompts = random_prompts(3, 300, lo=5, hi=30, seed=1)
    for i, p in enumerate(prompts):
        engine.add_request(f"p{i}", p, SamplingParams(max_tokens=1))
    seqs = {f"p{i}": engine.requests[f"p{i}"] for i in range(3)}
    sched = engine.scheduler.schedule()
    out = engine.runner.execute(sched.scheduled)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    for i, s in enumerate(out.order):
        p = s.seq.prompt_token_ids
        with torch.no_grad():
            r = ref(torch.tensor([p]), output_hidden_states=True)
        row, n = out.logit_rows[i]
        # transformers' RMSNorm computes in float32 even for a float64 model, hence float32-level tolerances.
        torch.testing.assert_close(out.logits[row].float(), r.logits[0, -1].float(), rtol=1e-4, atol=1e-4)
        want = torch.cat([r.hidden_states[t + 1][0] for t in taps], dim=-1)
        torch.testing.assert_close(out.taps[i], want, rtol=1e-4, atol=1e-4)
    assert set(s.seq.request_id for s in out.order) == set(seqs)


def test_greedy_single_prompts_match_generate(tiny_engine, tiny_dir):
    prompts = random_prompts(3, 49152, seed=2)
    ref = hf_greedy(tiny_dir, prompts, 24)
    for p, want in zip(prompts, ref):
        assert run_all(tiny_engine, [p], SamplingParams(max_tokens=24, ignore_eos=True)) == [want]


def test_greedy_batch_of_mixed_lengths_matches_generate(tiny_engine, tiny_dir):
    prompts = random_prompts(20, 49152, lo=1, hi=90, seed=3)
    ref = hf_greedy(tiny_dir, prompts, 20)
    assert run_all(tiny_engine, prompts, SamplingParams(max_tokens=20, ignore_eos=True)) == ref


def test_requests_joining_mid_flight_match_generate(tiny_engine, tiny_dir):
    prompts = random_prompts(12, 49152, lo=2, hi=60, seed=4)
    lengths = [5 + 3 * i for i in range(len(prompts))]
    refs = [hf_greedy(tiny_dir, [p], n)[0] for p, n in zip(prompts, lengths)]
    done, pending = {}, list(range(len(prompts)))
    step = 0
    while pending or tiny_engine.has_unfinished_requests():
        if pending and step % 3 == 0:  # a new request joins every third step
            i = pending.pop(0)
            tiny_engine.add_request(f"join{i}", prompts[i], SamplingParams(max_tokens=lengths[i], ignore_eos=True))
        for out in tiny_engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
        step += 1
    assert [done[f"join{i}"] for i in range(len(prompts))] == refs


def test_chunked_prefill_of_long_prompts_matches_generate(tiny_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_dir), dtype="float64", device="cpu", kv_cache_memory_gb=0.05,
                                    max_num_batched_tokens=64))
    prompts = random_prompts(3, 49152, lo=150, hi=300, seed=5) + random_prompts(3, 49152, lo=2, hi=10, seed=6)
    ref = hf_greedy(tiny_dir, prompts, 12)
    assert run_all(engine, prompts, SamplingParams(max_tokens=12, ignore_eos=True)) == ref


def test_taps_equal_hidden_states_of_whole_sequence(tiny_engine, tiny_dir):
    """Taps kept per sequence across prefill and decode steps equal output_hidden_states over the final text."""
    from transformers import AutoModelForCausalLM

    prompts = random_prompts(4, 49152, lo=5, hi=50, seed=7)
    for i, p in enumerate(prompts):
        tiny_engine.add_request(f"tap{i}", p, SamplingParams(max_tokens=9, ignore_eos=True))
    seqs = [tiny_engine.requests[f"tap{i}"] for i in range(4)]
    while tiny_engine.has_unfinished_requests():
        tiny_engine.step()
    ref = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float64).eval()
    for seq in seqs:
        computed = seq.token_ids[:-1]  # the last sampled token never went through the model
        with torch.no_grad():
            hs = ref(torch.tensor([computed]), output_hidden_states=True).hidden_states
        want = torch.cat([hs[1][0], hs[3][0]], dim=-1)
        torch.testing.assert_close(seq.taps.view(), want, rtol=1e-4, atol=1e-4)


def test_truncate_then_continue_equals_straight_run(tiny_engine):
    prompt = random_prompts(1, 49152, lo=20, hi=20, seed=8)[0]
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    straight = run_all(tiny_engine, [prompt], params)[0]
    # Run past the cut with a *different* continuation (forced by truncating and appending other tokens), then roll
    # back to the cut and continue: stale K/V past the cut must not leak into what follows.
    tiny_engine.add_request("cut", prompt, params)
    seq = tiny_engine.requests["cut"]
    while seq.num_output_tokens < 18:
        tiny_engine.step()
    cut = len(prompt) + 7
    tiny_engine.truncate("cut", cut)
    used_blocks = len(seq.block_table)
    assert used_blocks == -(-seq.num_computed_tokens // tiny_engine.config.block_size)
    out = None
    while tiny_engine.has_unfinished_requests():
        for o in tiny_engine.step():
            out = o
    assert out.request_id == "cut" and out.token_ids == straight


def test_truncate_with_foreign_tokens_rolls_back_kv(tiny_engine):
    prompt = random_prompts(1, 49152, lo=12, hi=12, seed=9)[0]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    straight = run_all(tiny_engine, [prompt], params)[0]
    tiny_engine.add_request("foreign", prompt, params)
    seq = tiny_engine.requests["foreign"]
    while seq.num_output_tokens < 4:
        tiny_engine.step()
    # Teacher-force 6 junk tokens through the model, then roll them back.
    seq.token_ids.extend([5, 6, 7, 8, 9, 10])
    while seq.num_computed_tokens < seq.num_tokens - 1:
        tiny_engine.step()
    tiny_engine.truncate("foreign", len(prompt) + 4)
    while tiny_engine.has_unfinished_requests():
        for o in tiny_engine.step():
            last = o
    assert last.token_ids == straight


def test_same_seed_same_sample_and_batch_independent(tiny_engine):
    prompts = random_prompts(3, 49152, lo=5, hi=30, seed=10)
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=20, seed=1234, ignore_eos=True)
    alone = run_all(tiny_engine, [prompts[0]], p)[0]
    batched = run_all(tiny_engine, prompts, p)[0]
    again = run_all(tiny_engine, [prompts[0]], p)[0]
    assert alone == again == batched
    other = run_all(tiny_engine, [prompts[0]], SamplingParams(temperature=1.0, max_tokens=20, seed=99,
                                                               ignore_eos=True))[0]
    assert other != alone


def test_top_p_that_underflows_keeps_the_most_likely_token():
    """Found by the schemathesis fuzz: top_p=5e-324 is valid (> 0) but 0 in float32, which once masked every token
    and sent NaN into the sampler."""
    from engine.sampler import SamplingBatch, sample

    logits = torch.tensor([[0.1, 2.0, -1.0, 0.5]])
    batch = SamplingBatch.build([SamplingParams(temperature=1.0, top_p=5e-324)], [None], torch.device("cpu"))
    assert [sample(logits, batch).item() for _ in range(20)] == [1] * 20


def test_preemption_recomputes_and_every_request_completes(tiny_dir):
    # 24 blocks of 16 tokens: far fewer than 10 requests of ~70 tokens need together.
    engine = LLMEngine(EngineConfig(model=str(tiny_dir), dtype="float64", device="cpu", block_size=16,
                                    kv_cache_memory_gb=24 * 16 * 4 * 2 * 2 * 16 * 8 / 2**30))
    assert engine.block_manager.num_blocks == 24
    prompts = random_prompts(10, 49152, lo=30, hi=60, seed=11)
    ref = hf_greedy(tiny_dir, prompts, 30)
    assert run_all(engine, prompts, SamplingParams(max_tokens=30, ignore_eos=True)) == ref
    assert engine.counters.preemptions > 0
    assert engine.block_manager.num_used == 0


def test_stop_rules(tiny_engine, default_tokenizer):
    prompt = random_prompts(1, 49152, lo=10, hi=10, seed=12)[0]
    free = run_all(tiny_engine, [prompt], SamplingParams(max_tokens=40, ignore_eos=True))[0]
    # stop_token_ids: ends at the first occurrence, inclusive.
    target = free[5]
    tiny_engine.add_request("stop-id", prompt, SamplingParams(max_tokens=40, ignore_eos=True, stop_token_ids=[target]))
    outs = []
    while tiny_engine.has_unfinished_requests():
        outs += tiny_engine.step()
    assert outs[-1].token_ids == free[: free.index(target) + 1] and outs[-1].finish_reason == "stop"
    # stop strings: the text ends right before the stop string, and the tokens end at the one completing it.
    text = default_tokenizer.decode(free, skip_special_tokens=True)
    stop = text[len(text) // 2: len(text) // 2 + 3]
    tiny_engine.add_request("stop-str", prompt, SamplingParams(max_tokens=40, ignore_eos=True, stop=[stop]))
    outs = []
    while tiny_engine.has_unfinished_requests():
        outs += tiny_engine.step()
    final = outs[-1]
    assert final.finish_reason == "stop"
    assert final.text == text[: text.index(stop)]
    assert "".join(o.new_text for o in outs) == final.text
    assert stop in default_tokenizer.decode(final.token_ids) and stop not in default_tokenizer.decode(final.token_ids[:-1])
    # max_tokens.
    assert run_all(tiny_engine, [prompt], SamplingParams(max_tokens=3, ignore_eos=True))[0] == free[:3]


def test_streamed_deltas_add_up(tiny_engine, default_tokenizer):
    prompt = "Once upon a time"
    tiny_engine.add_request("stream", prompt, SamplingParams(max_tokens=25, ignore_eos=True))
    outs = []
    while tiny_engine.has_unfinished_requests():
        outs += tiny_engine.step()
    assert sum((o.new_token_ids for o in outs), []) == outs[-1].token_ids
    assert "".join(o.new_text for o in outs) == outs[-1].text
    assert outs[-1].text == default_tokenizer.decode(outs[-1].token_ids, skip_special_tokens=True)


def test_bad_input_is_rejected_and_engine_keeps_serving(tiny_engine):
    tiny_engine.add_request("good", [10, 11, 12], SamplingParams(max_tokens=5, ignore_eos=True))
    with pytest.raises(ValueError, match="empty"):
        tiny_engine.add_request("e", [], SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        tiny_engine.add_request("e", "", SamplingParams())
    with pytest.raises(ValueError, match="context holds at most"):
        tiny_engine.add_request("long", [5] * tiny_engine.max_model_len, SamplingParams())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tiny_engine.add_request("oov", [10**6], SamplingParams())
    with pytest.raises(ValueError, match="already in use"):
        tiny_engine.add_request("good", [1], SamplingParams())
    for bad in (dict(max_tokens=0), dict(max_tokens=-3), dict(top_p=0.0), dict(top_p=1.5), dict(temperature=-1),
                dict(temperature=float("nan")), dict(top_k=-5), dict(speculation="sometimes")):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    with pytest.raises(ModelNotFoundError, match="not found"):
        LLMEngine(EngineConfig(model="/no/such/model"))
    outs = []
    while tiny_engine.has_unfinished_requests():
        outs += tiny_engine.step()
    assert outs[-1].request_id == "good" and len(outs[-1].token_ids) == 5


def test_abort_frees_blocks(tiny_engine):
    tiny_engine.add_request("a", list(range(10, 60)), SamplingParams(max_tokens=50, ignore_eos=True))
    tiny_engine.step()
    tiny_engine.step()
    assert tiny_engine.block_manager.num_used > 0
    assert tiny_engine.abort_request("a")
    assert tiny_engine.block_manager.num_used == 0 and not tiny_engine.has_unfinished_requests()
    assert not tiny_engine.abort_request("a")


@pytest.mark.slow
def test_default_model_greedy_matches_generate(default_model_dir):
    """The real SmolLM2-135M-Instruct in float32, through its chat template."""
    llm = LLM(dtype="float32", device="cpu", kv_cache_memory_gb=0.2)
    questions = ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers."]
    prompts = [llm.apply_chat_template([{"role": "user", "content": q}]) for q in questions]
    ref = hf_greedy(default_model_dir, prompts, 40, dtype=torch.float32, stop_at_eos=True)
    outs = llm.generate(prompts, SamplingParams(max_tokens=40))
    assert [o.token_ids for o in outs] == ref
    assert "Paris" in outs[0].text


def test_logprobs_match_transformers(tiny_engine, tiny_dir):
    from transformers import AutoModelForCausalLM

    prompt = random_prompts(1, 49152, lo=8, hi=8, seed=13)[0]
    tiny_engine.add_request("lp", prompt, SamplingParams(max_tokens=6, ignore_eos=True, logprobs=5))
    outs = []
    while tiny_engine.has_unfinished_requests():
        outs += tiny_engine.step()
    final = outs[-1]
    ref = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float64).eval()
    with torch.no_grad():
        logits = ref(torch.tensor([prompt + final.token_ids])).logits[0]
    for t, entry in enumerate(final.logprobs):
        lp = torch.log_softmax(logits[len(prompt) - 1 + t], -1)
        top = lp.topk(5)
        assert list(entry)[:5] == top.indices.tolist()
        assert final.token_ids[t] in entry
        for tok, v in entry.items():
            assert abs(v - lp[tok].item()) < 1e-4


def test_latency_histograms_count_every_step_and_phases_add_up(tiny_engine):
    """The inter-token latency histogram gets one observation per step that gives a request tokens after its first,
    the tokens-per-step histogram one per step whose total is the prompt and generation tokens counted; a finished
    request's phases (queue, prefill, decode) add up to its end-to-end time, as vLLM's do."""
    engine = tiny_engine
    before = engine.stats()
    itl0, iter0 = before["inter_token_latency_s"], before["iteration_tokens"]
    prompts = random_prompts(5, 300, lo=3, hi=20, seed=7)
    steps_with_tokens, finished = {}, {}
    for i, p in enumerate(prompts):
        engine.add_request(f"h{i}", p, SamplingParams(max_tokens=4 + i, ignore_eos=True))
    steps = 0
    while engine.has_unfinished_requests():
        outs = engine.step()
        steps += 1
        for out in outs:
            steps_with_tokens[out.request_id] = steps_with_tokens.get(out.request_id, 0) + bool(out.new_token_ids)
            if out.finished:
                finished[out.request_id] = out.metrics
    after = engine.stats()
    itl, it = after["inter_token_latency_s"], after["iteration_tokens"]
    assert itl["count"] - itl0["count"] == sum(n - 1 for n in steps_with_tokens.values())
    assert sum(itl["counts"]) == itl["count"] and itl["sum"] >= itl0["sum"]
    assert it["count"] - iter0["count"] == after["steps"] - before["steps"] == steps
    counted = (after["prompt_tokens"] + after["generation_tokens"]) - (before["prompt_tokens"]
                                                                       + before["generation_tokens"])
    assert it["sum"] - iter0["sum"] == counted == sum(map(len, prompts)) + sum(4 + i for i in range(5))
    for m in finished.values():
        assert m["queue_s"] >= 0 and m["prefill_s"] >= 0 and m["decode_s"] >= 0
        assert m["queue_s"] + m["prefill_s"] + m["decode_s"] == pytest.approx(m["e2e_s"], abs=1e-9)
        assert m["inference_s"] == pytest.approx(m["prefill_s"] + m["decode_s"], abs=1e-9)
