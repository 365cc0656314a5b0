"""The torch path (the GPU's) waits for the device at most once per engine step and once per draft round.

On a GPU every read of a device value on the host (.tolist(), .item(), int(), bool(), .nonzero(), a boolean mask
index, ...) waits for all queued work. This machine has no GPU, so the test follows device data instead: a
TorchFunctionMode marks the weights, the KV cache and what any torch function computes from marked tensors or
creates on the engine's device (device=...), and counts every syncing read of a marked tensor. Host-built index
tensors (from Python lists) stay unmarked, as on a GPU they stay on the host. engine/device_io.to_host, which reads a
step's results at one synchronization, counts as one read however many tensors it reads.
"""
from __future__ import annotations

import weakref
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from engine import EngineConfig, SamplingParams, device_io
from engine.llm_engine import LLMEngine
from tests.helpers import make_tiny_drafter, make_tiny_model

SYNCING = {"__bool__", "__int__", "__float__", "__index__", "item", "tolist", "numpy", "nonzero", "argwhere",
           "unique", "masked_select", "cpu", "__array__"}
FACTORIES = {"zeros", "ones", "empty", "full", "rand", "randn", "randint", "arange", "tensor", "zeros_like",
             "ones_like", "empty_like", "full_like", "rand_like"}


class DeviceReads(TorchFunctionMode):
    def __init__(self, seeds: list[torch.Tensor]):
        super().__init__()
        self.marked: dict[int, weakref.ref] = {}  # by id: a tensor's == is elementwise, so no set of tensors
        for t in seeds:
            self.mark(t)
        self.reads: Counter = Counter()
        self.in_to_host = 0

    def mark(self, t: torch.Tensor) -> None:
        self.marked[id(t)] = weakref.ref(t)

    def is_marked(self, t: torch.Tensor) -> bool:
        ref = self.marked.get(id(t))
        return ref is not None and ref() is t

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        flat = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        from_device = any(self.is_marked(a) for a in flat)
        if from_device and not self.in_to_host:
            mask_index = name == "__getitem__" and any(
                isinstance(a, torch.Tensor) and a.dtype == torch.bool for a in tree_flatten(args[1:])[0])
            if name in SYNCING or mask_index:
                self.reads[name] += 1
        out = func(*args, **kwargs)
        if from_device or (name in FACTORIES and "device" in kwargs):
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.mark(t)
        return out


def tensors_of(obj, depth: int = 3) -> list[torch.Tensor]:
    """The tensors an object holds (weights, caches), through its attributes, lists and dicts."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth == 0:
        return []
    if isinstance(obj, (list, tuple)):
        items = obj
    elif isinstance(obj, dict):
        items = obj.values()
    elif hasattr(obj, "__dict__"):
        items = vars(obj).values()
    else:
        return []
    return [t for item in items for t in tensors_of(item, depth - 1)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory, default_tokenizer):
    folder = tmp_path_factory.mktemp("syncs")
    target = make_tiny_model("llama", folder / "target", default_tokenizer)
    return target, make_tiny_drafter(folder / "drafter", len(default_tokenizer))


@pytest.fixture
def torch_path(monkeypatch):
    """DSPARK_KERNELS=torch for the engines built in the test: the ops a GPU runs."""
    monkeypatch.setenv("DSPARK_KERNELS", "torch")
    monkeypatch.setattr("engine.ops._kernels", None)
    monkeypatch.setattr("engine.ops._loaded", True)


def count_steps(engine, monkeypatch) -> list[dict]:
    """Per step: device reads by the engine (target forward, sampling, acceptance) and by the draft round."""
    service = getattr(engine.speculator, "service", None)
    seeds = tensors_of(engine.model) + tensors_of(engine.kv_cache)
    if service is not None:
        seeds += list(service.drafter.parameters()) + tensors_of(service.pool.cache)
    steps = []
    real = device_io.to_host

    def counted(tensors):
        mode.reads["to_host" if not tracing_draft[0] else "draft to_host"] += 1
        mode.in_to_host += 1
        try:
            return real(tensors)
        finally:
            mode.in_to_host -= 1

    tracing_draft = [False]
    if service is not None:
        real_step = service.step

        def draft_step(syncs, work):
            tracing_draft[0] = True
            before = sum(mode.reads.values())
            try:
                return real_step(syncs, work)
            finally:
                tracing_draft[0] = False
                drafts[0] += sum(mode.reads.values()) - before

        monkeypatch.setattr(service, "step", draft_step)
    monkeypatch.setattr(device_io, "to_host", counted)
    while engine.has_unfinished_requests():
        mode = DeviceReads(seeds)
        drafts = [0]
        with mode:
            engine.step()
        total = sum(mode.reads.values())
        steps.append({"engine": total - drafts[0], "draft": drafts[0], "reads": dict(mode.reads),
                      "drafted": engine.speculator is not None and engine.speculator.drafted})
    return steps


@pytest.mark.parametrize("speculation,temperature,penalties", [
    (None, 0.0, False), (None, 0.8, False), ("fixed:3", 0.0, False), ("fixed:3", 0.8, False),
    ("fixed:3+lookup", 0.8, True), ("fixed:3", 0.0, True)],
    ids=["plain-greedy", "plain-sampled", "verify-greedy", "verify-sampled", "lookup-sampled-penalties",
         "verify-greedy-penalties"])
def test_one_device_read_per_step_and_per_draft_round(pair, torch_path, monkeypatch, speculation, temperature,
                                                      penalties):
    target, drafter = pair
    engine = LLMEngine(EngineConfig(model=str(target), dtype="float32", device="cpu", kv_cache_memory_gb=0.05,
                                    drafter=str(drafter) if speculation else None, speculation=speculation,
                                    max_num_batched_tokens=64))
    assert engine.model.ops.fused is False  # the torch path
    extra = dict(presence_penalty=0.4, repetition_penalty=1.2, logit_bias={5: 1.0}) if penalties else {}
    for i in range(4):  # prompts of several chunks, sequences joining and finishing at different steps
        engine.add_request(f"r{i}", list(range(10 + i, 90 + 7 * i)),
                           SamplingParams(max_tokens=10 + 3 * i, temperature=temperature, seed=i, ignore_eos=True,
                                          speculation=speculation, **extra))  # a seeded request names its mode
    steps = count_steps(engine, monkeypatch)
    assert len(steps) > 10
    for s in steps:
        assert s["engine"] <= 1 and s["draft"] <= 1, s
        assert set(s["reads"]) <= {"to_host", "draft to_host"}, s  # no read outside to_host
    if speculation:
        assert any(s["drafted"] and s["draft"] == 1 for s in steps)
        assert engine.speculator.counters.draft_tokens > 0


def test_the_counter_sees_a_stray_read(pair, torch_path):
    """The instrument's power: a read of a device value outside to_host is counted."""
    target, _ = pair
    engine = LLMEngine(EngineConfig(model=str(target), dtype="float32", device="cpu", kv_cache_memory_gb=0.05))
    weights = tensors_of(engine.model)
    mode = DeviceReads(weights)
    with mode:
        w = weights[0]
        host_built = torch.tensor([1, 2, 3])
        if (w.sum() > 0) or True:
            int(host_built.max())  # host data: not counted
        (w * 2).tolist()
    assert mode.reads == Counter({"__bool__": 1, "tolist": 1}), mode.reads
