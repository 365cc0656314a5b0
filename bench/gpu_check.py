"""The short GPU check (issue 36): the engine's torch path on a GPU lent for a few minutes, on random-init targets of
the default model's shape and of Qwen3-4B's (fewer layers by default), each with a DeepSpec-shaped drafter.

1. Greedy equality in fp32, TF32 off: the engine on CPU against the engine on the GPU (its default attention,
   flex_attention, recorded as `attention`), on the GPU flex against SDPA over gathered blocks, and plain against
   speculation (fixed:3). Random weights make flat logits, so an answer may part at a near-tie: each first mismatch
   is checked against transformers' float64 forward on CPU, and only a gap above NEAR_TIE fails.
2. A sampled smoke test (T=1, fixed:3, the default dtype): every request finishes, every token is in the
   vocabulary, drafts are verified.
3. CUDA IPC between two processes over the draft actor's channel (draft_service.actor.SharedCuda): a tensor goes
   to a child process by handle and a result comes back the same way, as taps and draft probabilities do.
4. Per shape, in the default dtype: step times at batch 1, 16 and 64 with speculation off and fixed:3 (CUDA
   events around engine.step()), the engine's own SPS(B) curve and draft-round costs from its start-up sweep.

It needs no Ray and no install of the project: run from the repository root with torch, transformers and
safetensors present, pydantic carried as wheels where missing (scripts/gpu_check.sh installs .whl/*.whl). It
writes gpu_check.json (to --out) and prints a summary; it exits 1 when a check fails.

    scripts/gpu_check.sh                                             # on the GPU machine: JSON to $OUT
    .venv/bin/python bench/gpu_check.py --device cpu --quick --out /tmp/gpu_check   # the same code path on CPU
"""
from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NEAR_TIE = 1e-3  # a float64 logit gap below which fp32 rounding may pick either token
SHAPES = {  # transformers config fields; `layers` may be cut by --layers
    "smollm2-135m": dict(family="llama", hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                         num_key_value_heads=3, head_dim=64, num_hidden_layers=30, vocab_size=49152,
                         tie_word_embeddings=True, rope_theta=100000.0),
    "qwen3-4b": dict(family="qwen3", hidden_size=2560, intermediate_size=9728, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, num_hidden_layers=36, vocab_size=151936,
                     tie_word_embeddings=True, rope_theta=1000000.0),
    "tiny": dict(family="llama", hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, num_hidden_layers=4, vocab_size=512, tie_word_embeddings=True, rope_theta=10000.0),
}


def make_target(folder: Path, shape: dict, layers: int | None, device: str, seed: int = 0) -> Path:
    """A random-init target of `shape` (initialised on `device`, saved in fp32) with a word-level tokenizer over
    its vocabulary."""
    from tokenizers import Tokenizer, models
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast, Qwen3Config

    fields = dict(shape)
    cls = {"llama": LlamaConfig, "qwen3": Qwen3Config}[fields.pop("family")]
    if layers:
        fields["num_hidden_layers"] = min(layers, fields["num_hidden_layers"])
    config = cls(**fields, bos_token_id=1, eos_token_id=2, pad_token_id=2, max_position_embeddings=4096,
                 initializer_range=0.1)  # wider than 0.02: less flat logits, fewer near-ties
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(config.vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t2", pad_token="t2",
                            unk_token="t0").save_pretrained(folder)
    del model
    return folder


def make_drafter(folder: Path, target: Path) -> Path:
    """A random-init drafter shaped like DeepSpec's for `target`: 2 layers of the target's width, a block of 7,
    5 taps spread over the target's layers, a rank-64 Markov head, a confidence head, a 12k draft vocabulary."""
    from transformers import AutoConfig

    from draft_service.config import DSparkConfig
    from draft_service.model import DSparkDrafter

    t = AutoConfig.from_pretrained(target)
    n = t.num_hidden_layers
    taps = sorted({min(n - 1, round(i * (n - 1) / 4)) for i in range(5)})
    vocab = min(12288, t.vocab_size)
    cfg = DSparkConfig(vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                       num_hidden_layers=2, num_attention_heads=t.num_attention_heads,
                       num_key_value_heads=t.num_key_value_heads, head_dim=t.head_dim, max_position_embeddings=4096,
                       block_size=7, target_layer_ids=taps, num_target_layers=n, mask_token_id=3, markov_rank=64,
                       markov_head_type="vanilla", enable_confidence_head=True, confidence_head_with_markov=True,
                       draft_vocab_size=vocab, rope_theta=t.rope_theta if hasattr(t, "rope_theta") else 10000.0)
    torch.manual_seed(1)
    DSparkDrafter(cfg, draft_vocab=torch.arange(vocab)).init_weights().save_pretrained(folder)
    return folder


def engine_for(target: Path, drafter: Path | None, device: str, dtype: str, speculation: str | None = None,
               kv_gb: float = 1.0, max_num_seqs: int = 64, attention: str = "auto"):
    """`attention`: DSPARK_ATTENTION while the engine is built (on a GPU: auto is flex_attention; sdpa the fallback)."""
    import os
    from unittest import mock

    from draft_service.service import load_for_engine
    from engine import EngineConfig
    from engine.llm_engine import LLMEngine

    config = EngineConfig(model=str(target), device=device, dtype=dtype, kv_cache_memory_gb=kv_gb,
                          max_num_seqs=max_num_seqs, max_num_batched_tokens=2048,
                          drafter=str(drafter) if drafter else None, speculation=speculation)
    # The drafter from its folder directly: the project need not be installed (no entry point) on the GPU machine.
    factory = functools.partial(load_for_engine, str(drafter)) if drafter else None
    with mock.patch.dict(os.environ, {"DSPARK_ATTENTION": attention}):  # engine.ops.Ops reads it as it is built
        engine = LLMEngine(config, drafter_factory=factory)
    if drafter and engine.speculator is None:
        raise RuntimeError(f"the drafter did not load: {engine.drafter_error}")
    return engine


def generate(engine, prompts: list[list[int]], params) -> list[list[int]]:
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}-{time.monotonic_ns()}", p, params)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
    return [done[k] for k in sorted(done, key=lambda k: int(k[1:].split("-")[0]))]


def first_gap(target: Path, prompt: list[int], a: list[int], b: list[int]) -> dict | None:
    """Where answers a and b first part, and the float64 logit gap between their two tokens there."""
    from transformers import AutoModelForCausalLM

    d = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if d is None:
        return None
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float64).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + a[:d]])).logits[0, -1]
    return {"position": d, "gap": abs(float(logits[a[d]] - logits[b[d]]))}


def check_equality(folder: Path, device: str, quick: bool) -> dict:
    from engine import SamplingParams

    shape = SHAPES["tiny" if quick else "smollm2-135m"]
    target = make_target(folder / "eq-target", shape, None if quick else 6, "cpu")
    drafter = make_drafter(folder / "eq-drafter", target)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, shape["vocab_size"], (32,), generator=gen).tolist() for _ in range(6)]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    device_engine = engine_for(target, None, device, "float32", kv_gb=0.5)
    answers = {
        "cpu": generate(engine_for(target, None, "cpu", "float32", kv_gb=0.2), prompts, params),
        "device": generate(device_engine, prompts, params),
        "device_sdpa": generate(engine_for(target, None, device, "float32", kv_gb=0.5, attention="sdpa"), prompts,
                                params),
        "device_fixed3": generate(engine_for(target, drafter, device, "float32", "fixed:3", kv_gb=0.5), prompts,
                                  params),
    }
    result = {"prompts": len(prompts), "tokens": params.max_tokens, "attention": device_engine.model.ops.attention}
    ok = True
    for a, b in (("cpu", "device"), ("device", "device_sdpa"), ("device", "device_fixed3")):
        gaps = [first_gap(target, p, x, y) for p, x, y in zip(prompts, answers[a], answers[b])]
        parted = [g for g in gaps if g is not None]
        result[f"{a}_vs_{b}"] = {"identical": len(prompts) - len(parted), "parted": parted}
        ok &= all(g["gap"] < NEAR_TIE for g in parted)
    result["ok"] = ok
    return result


def check_sampling(target: Path, drafter: Path, device: str) -> dict:
    from engine import SamplingParams

    engine = engine_for(target, drafter, device, "auto", "fixed:3", kv_gb=1.0)
    vocab = engine.model.vocab_size if hasattr(engine.model, "vocab_size") else engine.tokenizer.vocab_size
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(4, vocab, (24,), generator=gen).tolist() for _ in range(8)]
    outs = generate(engine, prompts, SamplingParams(temperature=1.0, max_tokens=32, ignore_eos=True, seed=None))
    c = engine.speculator.counters
    ok = (len(outs) == len(prompts) and all(len(o) == 32 and all(0 <= t < vocab for t in o) for o in outs)
          and c.draft_tokens > 0)
    return {"ok": ok, "requests": len(outs), "draft_tokens": c.draft_tokens, "accepted_tokens": c.accepted_tokens}


def time_steps(engine, batch: int, mode: str, steps: int, vocab: int) -> dict:
    """Mean ms per engine.step() with `batch` sequences decoding (prefills done first), by CUDA events on a GPU."""
    from engine import SamplingParams

    gen = torch.Generator().manual_seed(batch)
    params = SamplingParams(max_tokens=steps * 5 + 64, ignore_eos=True, speculation=mode)
    ids = []
    for i in range(batch):
        rid = f"t{mode}{batch}-{i}-{time.monotonic_ns()}"
        engine.add_request(rid, torch.randint(4, vocab, (64,), generator=gen).tolist(), params)
        ids.append(rid)
    while any(s.num_output_tokens == 0 for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    cuda = engine.device.type == "cuda"
    emitted = 0
    if cuda:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    for _ in range(steps):
        emitted += sum(len(o.new_token_ids) for o in engine.step())
    wall = time.perf_counter() - t0
    if cuda:
        end.record()
        end.synchronize()
        device_ms = start.elapsed_time(end) / steps
    for rid in ids:
        engine.abort_request(rid)
    while engine.has_unfinished_requests():
        engine.step()
    return {"ms_per_step": wall / steps * 1e3, "device_ms_per_step": device_ms if cuda else None,
            "tokens_per_step": emitted / steps / batch}


def _ipc_child(address: str, authkey: bytes) -> None:
    """The other end of check_cuda_ipc: reads a shared tensor, answers with its sum and a new shared tensor."""
    from draft_service.actor import SharedCuda
    from draft_service.channel import Channel

    channel = Channel.connect(address, authkey)
    t = channel.recv().tensor()
    channel.send((t.sum().item(), SharedCuda.of(t * 2)))
    channel.recv()  # the parent has read the answer: its memory may go
    channel.close()


def check_cuda_ipc(device: str) -> dict:
    if device != "cuda":
        return {"ok": None, "why": "needs a GPU"}
    import multiprocessing
    import os

    from draft_service.actor import SharedCuda
    from draft_service.channel import Channel, listen

    authkey = os.urandom(16)
    listener, address = listen(authkey)
    child = multiprocessing.get_context("spawn").Process(target=_ipc_child, args=(address, authkey))
    child.start()
    channel = Channel(listener.accept())
    x = torch.arange(4096, dtype=torch.float32, device="cuda")
    channel.send(SharedCuda.of(x))
    total, shared = channel.recv(timeout=120)
    doubled = shared.tensor()
    ok = total == x.sum().item() and doubled.is_cuda and torch.equal(doubled, x * 2)
    channel.send("done")
    child.join(60)
    return {"ok": bool(ok), "child_exit": child.exitcode}


def profile_shape(name: str, folder: Path, device: str, layers: int | None, batches: list[int], steps: int) -> dict:
    target = make_target(folder / f"{name}-target", SHAPES[name], layers, device)
    drafter = make_drafter(folder / f"{name}-drafter", target)
    engine = engine_for(target, drafter, device, "auto", None, kv_gb=4.0 if device == "cuda" else 0.3,
                        max_num_seqs=max(batches))
    vocab = SHAPES[name]["vocab_size"]
    cost = engine.speculator.cost
    out = {"layers": engine.model.num_layers if hasattr(engine.model, "num_layers") else layers,
           "attention": engine.model.ops.attention,
           "dtype": str(engine.dtype).removeprefix("torch."), "sps": cost.table(),
           "draft_round_ms": ({n: s * 1e3 for n, s in zip(cost.draft.grid, cost.draft.seconds)}
                              if cost.draft is not None else None),
           "steps": {}}
    for b in batches:
        for mode in ("off", "fixed:3"):
            out["steps"][f"{mode}@{b}"] = time_steps(engine, b, mode, steps, vocab)
    out["sampling"] = check_sampling(target, drafter, device)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--quick", action="store_true", help="tiny shapes, batches 1 and 4 (the CPU test)")
    ap.add_argument("--layers", type=int, default=8, help="target layers of the Qwen3-4B shape (36 in the model)")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device", file=sys.stderr)
            return 2
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 for the equality check
        torch.backends.cudnn.allow_tf32 = False
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "device": args.device,
              "device_name": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor(),
              "torch": torch.__version__, "cuda": torch.version.cuda, "quick": args.quick}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        report["equality_fp32"] = check_equality(folder, args.device, args.quick)
        print("equality:", json.dumps(report["equality_fp32"]), flush=True)
        report["cuda_ipc"] = check_cuda_ipc(args.device)
        print("cuda ipc:", json.dumps(report["cuda_ipc"]), flush=True)
        shapes = {"tiny": None} if args.quick else {"smollm2-135m": None, "qwen3-4b": args.layers}
        batches = [1, 4] if args.quick else [1, 16, 64]
        report["shapes"] = {}
        for name, layers in shapes.items():
            report["shapes"][name] = profile_shape(name, folder, args.device, layers, batches,
                                                   4 if args.quick else args.steps)
            print(name, json.dumps(report["shapes"][name]["steps"]), flush=True)
    report["seconds"] = time.monotonic() - t0
    report["ok"] = (report["equality_fp32"]["ok"] and report["cuda_ipc"]["ok"] is not False
                    and all(s["sampling"]["ok"] for s in report["shapes"].values()))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    print(f"gpu_check: {'ok' if report['ok'] else 'FAILED'} in {report['seconds']:.0f} s -> {out / 'gpu_check.json'}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
