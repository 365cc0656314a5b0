"""The draft service as a Ray actor co-located with one engine replica, and the proxy the engine calls it through.

The actor holds one DraftService: the drafter's weights once, plus the draft contexts of all of that replica's
sequences. It reads the target's embedding and lm_head itself, straight from the target's safetensors (the drafter
shares them and checkpoints omit them), so the engine never ships weights. The engine gets a `DraftServiceProxy`,
which is a Drafter (engine/drafter.py) as the DraftService is. Ray starts, places and restarts the actor and answers
`info` and `ping`; the per-step calls go over a Unix socket to a thread of the actor (draft_service/channel.py), one
round trip each, served in order. Tensors travel as host buffers, except where the engine and the actor both run on
a GPU and a probe at connection shows that CUDA IPC works between them: then the taps and the draft probabilities
travel as CUDA IPC handles (`SharedCuda`) and never leave the device. Ray is imported only where it is used: an
engine process reaches the actor through a proxy without Ray.

Failure: a proxy call on a dead actor raises, the Speculator falls back to plain decoding, and Ray restarts the actor
(max_restarts). The restarted actor has no contexts; the first step that names a context it lost raises (see
DraftService.step), and the Speculator then rebuilds every context from the engine's taps. While the actor is coming
back the proxy fails fast instead of blocking the engine thread. Releases are never dropped: those made while the
actor is unreachable go with the next call, unless that call reaches a new incarnation (which holds no contexts).
"""
from __future__ import annotations

import json
import logging
import os
import pickle
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from draft_service.channel import Channel, listen
from draft_service.service import DraftService
from engine.attention import KVCache
from engine.drafter import ContextSync, DraftStep, DraftWork
from engine.llm_engine import CPU_KV_CACHE_DEFAULT_GB, MAX_CONTEXT_DEFAULT
from engine.loader import resolve_device, resolve_dtype

log = logging.getLogger(__name__)


class DraftActorUnavailable(RuntimeError):
    """The draft actor is restarting or dead; the engine decodes without drafts meanwhile."""


def load_target_head(target_dir: str | os.PathLike, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's input embedding and lm_head weight, read tensor by tensor from its safetensors files (the rest
    of the model is never loaded). A tied lm_head (SmolLM2) is the embedding itself."""
    from safetensors import safe_open

    folder = Path(target_dir)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = {k: folder / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    else:
        with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
            files = {k: folder / "model.safetensors" for k in f.keys()}

    def read(*names: str) -> torch.Tensor | None:
        for name in names:
            if name in files:
                with safe_open(str(files[name]), framework="pt") as f:
                    return f.get_tensor(name).to(dtype)
        return None

    embed = read("model.embed_tokens.weight", "embed_tokens.weight")
    if embed is None:
        raise ValueError(f"no embed_tokens weight in {folder}")
    cfg = json.loads((folder / "config.json").read_text())
    lm_head = None if cfg.get("tie_word_embeddings", False) else read("lm_head.weight")
    return embed, embed if lm_head is None else lm_head


def draft_context_tokens(target_dir: str | os.PathLike, engine_config, dtype: torch.dtype, device: torch.device) -> int:
    """The context budget the engine would give an in-process service: the tokens its KV cache holds, plus a
    partial page per sequence (mirrors LLMEngine._start_drafter, computed from config.json alone)."""
    cfg = json.loads((Path(target_dir) / "config.json").read_text())
    if engine_config.kv_cache_memory_gb is None and device.type == "cuda":
        # The engine sizes a GPU cache from free memory, which the actor cannot see in advance: budget every
        # sequence a full context instead.
        tokens = engine_config.max_num_seqs * min(engine_config.max_model_len or MAX_CONTEXT_DEFAULT,
                                                  cfg.get("max_position_embeddings", MAX_CONTEXT_DEFAULT))
    else:
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        per_block = KVCache.bytes_per_block(cfg["num_hidden_layers"], engine_config.block_size,
                                            cfg["num_key_value_heads"], head_dim, dtype)
        budget = int((engine_config.kv_cache_memory_gb or CPU_KV_CACHE_DEFAULT_GB) * 2**30)
        tokens = budget // per_block * engine_config.block_size
    return tokens + engine_config.max_num_seqs * 16


@dataclass
class Packed:
    """A tensor as a numpy buffer, which Ray serializes out of band. Pickling a torch tensor goes through
    torch.save, a fixed cost per tensor each way that one round's taps would pay once per sequence."""
    data: np.ndarray  # the tensor's bytes
    dtype: str
    shape: tuple[int, ...]

    @classmethod
    def of(cls, t: torch.Tensor) -> Packed:
        t = t.detach().to("cpu").contiguous()
        return cls(t.view(torch.uint8).numpy(), str(t.dtype).removeprefix("torch."), tuple(t.shape))

    def tensor(self) -> torch.Tensor:
        data = self.data if self.data.flags.writeable else self.data.copy()  # torch wants writable memory
        return torch.from_numpy(data).view(getattr(torch, self.dtype)).reshape(self.shape)


@dataclass
class SharedCuda:
    """A CUDA tensor passed by handle, as torch.multiprocessing shares one: the receiver maps the sender's device
    memory, nothing goes through the host. torch keeps the block alive on the sender's side until the receiver
    drops its tensor, and the receiver's stream waits on an event recorded when the handle was made, so the values
    it reads are the finished ones. Both processes must see the GPU (the actor sits in the replica's bundle)."""
    rebuild: object  # torch.multiprocessing.reductions.rebuild_cuda_tensor
    args: tuple

    @classmethod
    def of(cls, t: torch.Tensor) -> SharedCuda:
        from torch.multiprocessing.reductions import reduce_tensor

        rebuild, args = reduce_tensor(t.detach().contiguous())
        return cls(rebuild, args)

    def tensor(self) -> torch.Tensor:
        return self.rebuild(*self.args)


def pack(t: torch.Tensor, share_cuda: bool) -> Packed | SharedCuda:
    return SharedCuda.of(t) if share_cuda and t.is_cuda else Packed.of(t)


def pack_syncs(syncs: list[ContextSync], share_cuda: bool = False,
               ) -> tuple[list[tuple[str, int, int]], Packed | SharedCuda | None]:
    """(key, keep, new rows) per sync, and all the new tap rows in one buffer (or one CUDA handle)."""
    rows = [s.taps for s in syncs if s.taps is not None and s.taps.shape[0]]
    meta = [(s.key, s.keep, 0 if s.taps is None else s.taps.shape[0]) for s in syncs]
    return meta, pack(torch.cat(rows), share_cuda) if rows else None


def unpack_syncs(meta: list[tuple[str, int, int]], packed: Packed | SharedCuda | None) -> list[ContextSync]:
    rows = packed.tensor() if packed is not None else None
    out, start = [], 0
    for key, keep, n in meta:
        out.append(ContextSync(key, keep, rows[start:start + n] if n else None))
        start += n
    return out


class DraftActor:
    """One replica's DraftService. Wrap with `ray.remote(...)` (see `start_draft_actor`) to run it as an actor."""

    def __init__(self, drafter_dir: str, target_dir: str, dtype: str, device: str, max_context_tokens: int,
                 num_threads: int | None = None):
        if num_threads:
            torch.set_num_threads(num_threads)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        embed, lm_head = load_target_head(target_dir, self.dtype)
        tied = lm_head is embed
        embed = embed.to(self.device)
        lm_head = embed if tied else lm_head.to(self.device)
        self.service = DraftService.load(drafter_dir, embed, lm_head, self.dtype, self.device, max_context_tokens)
        self.incarnation = uuid.uuid4().hex  # a restarted actor is a new incarnation
        self.num_steps = 0
        self.step_seconds = 0.0
        self.authkey = os.urandom(16)
        self.share_cuda = False  # this connection's proxy reads CUDA IPC handles (probe_cuda_ipc)
        self.listener, self.address = listen(self.authkey)
        threading.Thread(target=self._serve, args=(torch.get_num_threads(),), name="draft-channel",
                         daemon=True).start()

    def _serve(self, num_threads: int) -> None:
        """One proxy at a time; its calls run here, in order. Ray's own thread only answers info, ping and stats."""
        torch.set_num_threads(num_threads)
        while True:
            try:
                channel = Channel(self.listener.accept())
            except Exception as exc:  # e.g. a client with the wrong key
                log.warning("draft channel: refused a connection: %r", exc)
                continue
            self.share_cuda = False
            try:
                while True:
                    op, released, args = channel.recv()
                    try:
                        self.release(released)
                        ops = ("step", "stats", "probe_cuda_ipc")
                        reply = ("ok", getattr(self, op)(*args) if op in ops else None)
                    except Exception as exc:
                        reply = ("error", exc)
                    try:
                        channel.send(reply)
                    except (pickle.PicklingError, TypeError, AttributeError):
                        channel.send(("error", RuntimeError(repr(reply[1]))))
            except (EOFError, OSError):
                channel.close()  # the proxy went away (or gave up on a slow call): wait for the next one

    def info(self) -> dict:
        import ray

        vocab = self.service.drafter.draft_vocab
        return {
            "gamma": self.service.gamma,
            "vocab_size": self.service.vocab_size,
            "tap_layers": self.service.tap_layers,
            "copy_hint_ngram": self.service.copy_hint_ngram,
            "draft_vocab": None if vocab is None else vocab.cpu(),
            **self.ping(),
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
        }

    def ping(self) -> dict:
        """Where to connect; a restarted actor answers with a new incarnation and address."""
        return {"incarnation": self.incarnation, "address": self.address, "authkey": self.authkey}

    def probe_cuda_ipc(self, shared: SharedCuda, expect: list[float]) -> bool:
        """Whether a CUDA tensor the proxy shared by handle reads back here as sent; if so, this connection's
        draft probabilities go back by handle too."""
        t = shared.tensor()
        self.share_cuda = t.is_cuda and self.device.type == "cuda" and t.tolist() == expect
        return self.share_cuda

    def step(self, syncs: list[tuple[str, int, int]], taps: Packed | SharedCuda | None,
             work: list[DraftWork]) -> tuple[DraftStep | None, bool]:
        """DraftService.step, with the syncs' tap rows packed (see `pack_syncs`) and CPU tensors out. Returns (step,
        whether it used the draft vocabulary): the vocabulary itself never travels per step, the proxy has it from
        `info`."""
        t0 = time.perf_counter()
        step = self.service.step(unpack_syncs(syncs, taps), work)
        self.num_steps += 1
        self.step_seconds += time.perf_counter() - t0
        if step is None:
            return None, False
        used_vocab = step.draft_vocab is not None
        step.draft_vocab = None
        if step.probs is not None:
            step.probs = pack(step.probs, self.share_cuda)
        return step, used_vocab

    def release(self, keys: list[str]) -> None:
        self.service.release(keys)

    def stats(self) -> dict:
        return {**self.service.stats(), "steps": self.num_steps, "step_seconds": self.step_seconds,
                "incarnation": self.incarnation}


def start_draft_actor(drafter_dir: str, target_dir: str, dtype: str, device: str, max_context_tokens: int, *,
                      num_cpus: float = 1, num_gpus: float = 0, max_restarts: int = -1, name: str | None = None,
                      num_threads: int | None = None, placement_group=None, bundle_index: int = 0, **options):
    """Create the actor; inside a placement group it goes into `bundle_index` (the replica's own bundle, so it shares
    the replica's node and, with fractional num_gpus, its GPU)."""
    import ray

    if placement_group is not None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=placement_group, placement_group_bundle_index=bundle_index)
    cls = ray.remote(DraftActor)
    return cls.options(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=max_restarts, max_task_retries=0,
                       name=name, **options).remote(drafter_dir, str(target_dir), dtype, device,
                                                    max_context_tokens, num_threads or max(1, int(num_cpus)))


class RayLocator:
    """Finds the draft actor again after a failure: a ping that Ray retries while the actor restarts."""

    def __init__(self, actor):
        self.actor = actor
        self.pending = None

    def start(self) -> None:
        self.pending = self.actor.ping.options(max_task_retries=-1).remote()

    def poll(self) -> dict | None:
        """Where the actor listens now, or None while it is restarting; raises if it is gone for good."""
        import ray

        done, _ = ray.wait([self.pending], timeout=0)
        return ray.get(self.pending) if done else None


class DraftServiceProxy:
    """The engine's Drafter when the drafter runs in an actor: `LLMEngine(config, drafter_factory=lambda target:
    DraftServiceProxy(actor))`. Called only from the engine thread. `DraftServiceProxy.connect(info, locator)` builds
    one without Ray (an engine in a process of its own, engine/engine_process.py), from the actor's `info` and a
    locator for reconnects."""

    def __init__(self, actor, device: str | torch.device = "cpu", timeout_s: float = 30.0,
                 startup_timeout_s: float = 600.0):
        import ray

        info = ray.get(actor.info.remote(), timeout=startup_timeout_s)  # raises if the actor could not start
        self._setup(info, RayLocator(actor), device, timeout_s)
        self.actor = actor

    @classmethod
    def connect(cls, info: dict, locator, device: str | torch.device = "cpu",
                timeout_s: float = 30.0) -> DraftServiceProxy:
        proxy = cls.__new__(cls)
        proxy._setup(info, locator, device, timeout_s)
        return proxy

    def _setup(self, info: dict, locator, device, timeout_s: float) -> None:
        self.locator = locator
        self.device = torch.device(device)
        self.timeout_s = timeout_s
        self.info = {k: v for k, v in info.items() if k not in ("draft_vocab", "authkey", "address")}
        self.gamma: int = info["gamma"]
        self.vocab_size: int = info["vocab_size"]
        self.tap_layers: list[int] = list(info["tap_layers"])
        ngram = info.get("copy_hint_ngram")
        self.copy_hint_ngram: tuple[int, int] | None = None if ngram is None else tuple(ngram)
        vocab = info["draft_vocab"]
        self._draft_vocab = None if vocab is None else vocab.to(self.device)
        self._locating = False  # after a failure: usable again once the locator finds the actor
        self._released: list[str] = []  # not yet delivered to the actor
        self.failures = 0
        self._connect(info)

    def _connect(self, where: dict) -> None:
        if where["incarnation"] != self.info["incarnation"]:
            self._released.clear()  # a new incarnation holds no contexts
            self.info["incarnation"] = where["incarnation"]
        self.channel = Channel.connect(where["address"], where["authkey"])
        self.share_cuda = self._probe_cuda_ipc()

    def _probe_cuda_ipc(self) -> bool:
        """Whether this engine and its actor, both on a GPU, can pass tensors by CUDA IPC handle: a small tensor
        goes across and must read back as sent. Anything else keeps host buffers (on CPU there is nothing to ask)."""
        if self.device.type != "cuda" or not str(self.info.get("device", "")).startswith("cuda"):
            return False
        try:
            probe = torch.arange(4, dtype=torch.float32, device=self.device) + 0.5
            self.channel.send(("probe_cuda_ipc", [], (SharedCuda.of(probe), probe.tolist())))
            status, ok = self.channel.recv(timeout=self.timeout_s)
        except (OSError, EOFError, TimeoutError):
            raise
        except Exception as exc:
            status, ok = "error", exc
        if status != "ok" or ok is not True:
            log.warning("draft channel: CUDA IPC unavailable (%r); taps and drafts go through host memory", ok)
            return False
        return True

    def _ready(self) -> None:
        if not self._locating:
            return
        try:
            where = self.locator.poll()
            if where is None:
                raise DraftActorUnavailable("the draft actor is restarting")
            self._connect(where)
        except DraftActorUnavailable:
            raise
        except Exception as exc:
            self.locator.start()  # dead for good: this fails fast every time
            raise DraftActorUnavailable(f"the draft actor is unavailable: {exc}") from exc
        self._locating = False

    def _call(self, op: str, *args):
        self._ready()
        released, self._released = self._released, []
        try:
            self.channel.send((op, released, args))
            status, value = self.channel.recv(timeout=self.timeout_s)
        except Exception:  # the actor died, or is too slow: drop the link and re-check the actor first
            self._released = released + self._released
            self.failures += 1
            self.channel.close()
            self._locating = True
            self.locator.start()
            raise
        if status == "error":  # raised by the service (e.g. a context it lost); the link is fine
            raise value
        return value

    def step(self, syncs: list[ContextSync], work: list[DraftWork]) -> DraftStep | None:
        step, used_vocab = self._call("step", *pack_syncs(syncs, self.share_cuda), work)
        if step is None:
            return None
        if used_vocab:
            step.draft_vocab = self._draft_vocab
        if step.probs is not None:
            step.probs = step.probs.tensor().to(self.device)
        return step

    def release(self, keys: list[str]) -> None:
        """Frees the contexts now, or, while the actor is unreachable, with the next call that reaches it."""
        self._released.extend(keys)
        if not self._locating and self._released:
            self._call("release")

    def stats(self) -> dict:
        return self._call("stats")
