"""Training data for the drafter: the target answers the prompts itself, through the engine, and we cache what
training needs so it is never recomputed:

- the tokens of every sample (prompt + response);
- the raw outputs of the tap layers for every token the target computed (the drafter's context);
- the target's top-k next-token distribution at every response position (distillation targets).

The cache is a folder of flat binary files plus `index.jsonl` (one line per finished sample, written after its
data), so an interrupted run resumes where it stopped.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from engine import SamplingParams

FILES = {  # name -> numpy dtype of one element
    "tokens": np.int32,
    "taps": np.uint16,  # bfloat16 bits
    "topk_ids": np.int32,
    "topk_logp": np.float16,
}


@dataclass
class Sample:
    id: str
    n_tokens: int
    prompt_len: int
    tok_off: int  # row offset in tokens.bin
    tap_off: int  # row offset in taps.bin (n_tokens - 1 rows: the last token was never run)
    lab_off: int  # row offset in topk_*.bin (n_tokens - prompt_len rows: one per response token)
    temperature: float


class CacheWriter:
    def __init__(self, folder: Path, tap_width: int, topk: int):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.tap_width, self.topk = tap_width, topk
        meta = self.folder / "meta.json"
        if meta.exists():
            old = json.loads(meta.read_text())
            if (old["tap_width"], old["topk"]) != (tap_width, topk):
                raise ValueError(f"cache {folder} was made with other settings: {old}")
        meta.write_text(json.dumps({"tap_width": tap_width, "topk": topk}))
        self.samples = read_index(self.folder)
        # Drop bytes written after the last indexed sample (a crash mid-sample).
        ends = {"tokens": 0, "taps": 0, "topk_ids": 0, "topk_logp": 0}
        if self.samples:
            s = self.samples[-1]
            ends = {"tokens": s.tok_off + s.n_tokens, "taps": s.tap_off + s.n_tokens - 1,
                    "topk_ids": s.lab_off + s.n_tokens - s.prompt_len}
            ends["topk_logp"] = ends["topk_ids"]
        self.rows = dict(ends)
        width = {"tokens": 1, "taps": tap_width, "topk_ids": topk, "topk_logp": topk}
        self.files = {}
        for name, dtype in FILES.items():
            path = self.folder / f"{name}.bin"
            path.touch()
            os.truncate(path, ends[name] * width[name] * np.dtype(dtype).itemsize)
            self.files[name] = open(path, "ab")
        self.index = open(self.folder / "index.jsonl", "a")

    @property
    def done_ids(self) -> set[str]:
        return {s.id for s in self.samples}

    def add(self, sample_id: str, tokens: list[int], prompt_len: int, taps: torch.Tensor,
            logprobs: list[dict[int, float]], temperature: float) -> None:
        n = len(tokens)
        assert taps.shape == (n - 1, self.tap_width), (taps.shape, n)
        assert len(logprobs) == n - prompt_len
        ids = np.zeros((len(logprobs), self.topk), np.int32)
        logp = np.full((len(logprobs), self.topk), -np.inf, np.float16)
        for i, entry in enumerate(logprobs):
            top = sorted(entry.items(), key=lambda kv: -kv[1])[: self.topk]
            ids[i, : len(top)] = [t for t, _ in top]
            logp[i, : len(top)] = [v for _, v in top]
        sample = Sample(sample_id, n, prompt_len, self.rows["tokens"], self.rows["taps"], self.rows["topk_ids"],
                        temperature)
        self._write("tokens", np.asarray(tokens, np.int32))
        self._write("taps", taps.to(torch.bfloat16).contiguous().view(torch.uint16).cpu().numpy())
        self._write("topk_ids", ids)
        self._write("topk_logp", logp)
        for f in self.files.values():
            f.flush()
        self.index.write(json.dumps(sample.__dict__) + "\n")
        self.index.flush()
        self.samples.append(sample)

    def _write(self, name: str, array: np.ndarray) -> None:
        self.files[name].write(np.ascontiguousarray(array, dtype=FILES[name]).tobytes())
        self.rows[name] += array.shape[0]

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.index.close()


def read_index(folder: Path) -> list[Sample]:
    path = Path(folder) / "index.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[:-1]  # a last line without its newline is still being written
    return [Sample(**json.loads(line)) for line in lines if line.strip()]


class Cache:
    """Read side: memory-mapped arrays and the sample index."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        meta = json.loads((self.folder / "meta.json").read_text())
        self.tap_width, self.topk = meta["tap_width"], meta["topk"]
        self.samples = read_index(self.folder)
        width = {"tokens": 1, "taps": self.tap_width, "topk_ids": self.topk, "topk_logp": self.topk}
        self.arrays = {}
        for name, dtype in FILES.items():
            path = self.folder / f"{name}.bin"
            rows = path.stat().st_size // (width[name] * np.dtype(dtype).itemsize)
            shape = (rows,) if name == "tokens" else (rows, width[name])
            self.arrays[name] = np.memmap(path, dtype=dtype, mode="r", shape=shape) if rows else np.zeros(shape, dtype)

    def tokens(self, s: Sample) -> np.ndarray:
        return self.arrays["tokens"][s.tok_off: s.tok_off + s.n_tokens]

    def taps(self, s: Sample) -> torch.Tensor:
        raw = np.array(self.arrays["taps"][s.tap_off: s.tap_off + s.n_tokens - 1])
        return torch.from_numpy(raw.view(np.int16)).view(torch.bfloat16)

    def targets(self, s: Sample) -> tuple[np.ndarray, np.ndarray]:
        """Top-k ids and log-probs of the target at each response position."""
        sl = slice(s.lab_off, s.lab_off + s.n_tokens - s.prompt_len)
        return np.array(self.arrays["topk_ids"][sl]), np.array(self.arrays["topk_logp"][sl], dtype=np.float32)


def generate_cache(engine, prompts: list[dict], folder: Path, *, temperatures: list[float], max_tokens: int,
                   topk: int = 32, concurrency: int = 64, seed: int = 0) -> Path:
    """Let the target answer every prompt at every temperature and cache tokens, taps and top-k distributions.
    A prompt is {"id", "messages"} (chat) or {"id", "token_ids"}. `engine` is an LLMEngine built with the drafter's
    tap layers. Resumable."""
    if not engine.tap_layers:
        raise ValueError("the engine must tap the drafter's target layers")
    writer = CacheWriter(folder, len(engine.tap_layers) * engine.model.hidden_size, topk)
    done = writer.done_ids
    jobs = [(f"{p['id']}@{t:g}", p, t) for t in temperatures for p in prompts if f"{p['id']}@{t:g}" not in done]
    bar = tqdm(total=len(jobs), desc=f"target answers -> {folder}", unit="sample", smoothing=0.05)
    live: dict[str, tuple[object, float]] = {}
    n_tokens = 0
    try:
        while jobs or live:
            while jobs and len(live) < concurrency:
                rid, prompt, temp = jobs.pop(0)
                ids = prompt.get("token_ids") or engine.tokenizer.apply_chat_template(
                    prompt["messages"], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
                params = SamplingParams(temperature=temp, top_p=0.9 if temp else 1.0, max_tokens=max_tokens,
                                        logprobs=topk, seed=None if not temp else seed + len(live) + bar.n)
                engine.add_request(rid, list(ids), params)
                live[rid] = (engine.requests[rid], temp)
            for out in engine.step():
                if out.finished:
                    seq, temp = live.pop(out.request_id)
                    writer.add(out.request_id, seq.token_ids, seq.num_prompt_tokens, seq.taps.view(),
                               seq.logprobs, temp)
                    n_tokens += seq.num_output_tokens
                    bar.update(1)
                    bar.set_postfix(tokens=n_tokens)
    finally:
        bar.close()
        writer.close()
    return Path(folder)
