"""The drafter campaign: a plan of (prompt, temperature) answers the target writes in the background over many
sittings, kept as compact shards that outlive a machine, and the features training reads, rebuilt from the shards
where they were lost.

    <folder>/plan.json                   the prompt sets and the temperature mix (fixed when the campaign starts)
    <folder>/answers/<split>/manifest.json   what made the answers (target, dtype, engine commit, sampling), the shards
    <folder>/answers/<split>/shard-NNNNN.npz token ids as uint16, offsets, prompt lengths, temperatures, answer ids
    <folder>/cache/<split>/              draft_service.data caches (taps, top-k): large, never committed

The shards are the campaign's durable state (about 2 bytes a token); the caches are derived from them. Each step
is resumable: generation skips answers already cached, shards are cut from the cache's finished answers, and
`featurize` rebuilds a cache from shards by one teacher-forced target forward per answer.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from draft_service.data import Cache, CacheWriter, generate_cache

SHARD_ANSWERS = 512
TOP_P = 0.9  # sampled answers (data.generate_cache)


@dataclass
class Answer:
    id: str  # "<prompt id>@<temperature>"
    token_ids: np.ndarray  # prompt + response
    prompt_len: int
    temperature: float


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def engine_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# ----- shards ---------------------------------------------------------------------------------------------------------

def load_manifest(answers_dir: Path) -> dict:
    path = Path(answers_dir) / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {"shards": []}


def save_manifest(answers_dir: Path, manifest: dict) -> None:
    Path(answers_dir).mkdir(parents=True, exist_ok=True)
    _atomic_write(Path(answers_dir) / "manifest.json", json.dumps(manifest, indent=1).encode())


def write_shard(answers_dir: Path, number: int, answers: list[Answer]) -> dict:
    """Write one shard atomically and return its manifest entry."""
    lengths = np.array([len(a.token_ids) for a in answers], np.int64)
    tokens = np.concatenate([np.asarray(a.token_ids) for a in answers])
    if tokens.max(initial=0) > np.iinfo(np.uint16).max:
        raise ValueError("token ids beyond uint16: this vocabulary needs wider shards")
    name = f"shard-{number:05d}.npz"
    Path(answers_dir).mkdir(parents=True, exist_ok=True)
    path = Path(answers_dir) / name
    tmp = path.with_name(name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez_compressed(f, tokens=tokens.astype(np.uint16), offsets=np.concatenate([[0], np.cumsum(lengths)]),
                            prompt_lens=np.array([a.prompt_len for a in answers], np.int32),
                            temperatures=np.array([a.temperature for a in answers], np.float64),
                            ids=np.array([a.id for a in answers]))
    os.replace(tmp, path)
    return {"file": name, "answers": len(answers), "tokens": int(lengths.sum()),
            "response_tokens": int(lengths.sum() - sum(a.prompt_len for a in answers)),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def read_shard(path: Path) -> Iterator[Answer]:
    with np.load(path) as z:
        tokens, offsets = z["tokens"], z["offsets"]
        for i, (rid, plen, temp) in enumerate(zip(z["ids"], z["prompt_lens"], z["temperatures"])):
            yield Answer(str(rid), tokens[offsets[i]: offsets[i + 1]].astype(np.int64), int(plen), float(temp))


def read_answers(answers_dir: Path) -> Iterator[Answer]:
    """Every answer of the manifest's shards, checked against their recorded digests."""
    for entry in load_manifest(answers_dir)["shards"]:
        path = Path(answers_dir) / entry["file"]
        if hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
            raise ValueError(f"{path} does not match its manifest entry")
        yield from read_shard(path)


def shard_ids(answers_dir: Path) -> set[str]:
    return {a.id for a in read_answers(answers_dir)}


def cut_shards(cache_dir: Path, answers_dir: Path, *, final: bool = False, info: dict | None = None) -> int:
    """Move the cache's finished answers that no shard holds yet into new shards of SHARD_ANSWERS (the remainder
    too when `final`). `info` (target, dtype, sampling) is recorded in the manifest. Returns the answers written."""
    manifest = load_manifest(answers_dir)
    if info:
        manifest.update({k: v for k, v in info.items() if k != "shards"})
    have = shard_ids(answers_dir)
    cache = Cache(cache_dir)
    pending = [s for s in cache.samples if s.id not in have]
    written = 0
    while len(pending) >= SHARD_ANSWERS or (final and pending):
        group, pending = pending[:SHARD_ANSWERS], pending[SHARD_ANSWERS:]
        answers = [Answer(s.id, cache.tokens(s), s.prompt_len, s.temperature) for s in group]
        entry = write_shard(answers_dir, len(manifest["shards"]), answers)
        entry["engine_commit"] = engine_commit()
        manifest["shards"].append(entry)
        save_manifest(answers_dir, manifest)
        written += len(group)
    return written


# ----- features ---------------------------------------------------------------------------------------------------

@torch.no_grad()
def featurize(answers_dir: Path, cache_dir: Path, target, tap_layers: list[int], topk: int = 32,
              log=print) -> int:
    """Rebuild a cache from shards: one teacher-forced forward of the target (a transformers model) per answer gives
    the taps (the outputs of the tap layers) and the top-k next-token log-probs at response positions. Resumable;
    returns the answers added."""
    writer = CacheWriter(cache_dir, len(tap_layers) * target.config.hidden_size, topk)
    done, added = writer.done_ids, 0
    try:
        for a in read_answers(answers_dir):
            if a.id in done:
                continue
            ids = torch.as_tensor(a.token_ids[:-1]).unsqueeze(0)
            out = target(input_ids=ids, output_hidden_states=True)
            taps = torch.cat([out.hidden_states[i + 1][0] for i in tap_layers], dim=-1)
            logp = torch.log_softmax(out.logits[0, a.prompt_len - 1:].float(), dim=-1)
            top = logp.topk(topk, dim=-1)
            logprobs = [dict(zip(i.tolist(), v.tolist())) for i, v in zip(top.indices, top.values)]
            writer.add(a.id, a.token_ids.tolist(), a.prompt_len, taps, logprobs, a.temperature)
            added += 1
            if added % 100 == 0:
                log(f"featurize {cache_dir}: {added} answers")
    finally:
        writer.close()
    return added


# ----- the plan ---------------------------------------------------------------------------------------------------

def temperature_for(prompt_id: str, mix: list[tuple[float, float]]) -> float:
    """Each prompt is answered once, at a temperature drawn from `mix` [(T, share)] by a hash of its id, so the
    choice is the same on every machine and every resume."""
    u = zlib.crc32(prompt_id.encode()) / 2**32
    acc = 0.0
    for temp, share in mix:
        acc += share
        if u < acc:
            return temp
    return mix[-1][0]


def plan_jobs(prompt_sets: dict[str, list[dict]], mix: list[tuple[float, float]], chunk: int) -> list[tuple[float, list[dict]]]:
    """Chunks of prompts sharing a temperature, interleaved across the sets, so any prefix of the campaign is a
    mixture of every set and temperature."""
    queues = []
    for prompts in prompt_sets.values():
        by_temp: dict[float, list[dict]] = {}
        for p in prompts:
            by_temp.setdefault(temperature_for(p["id"], mix), []).append(p)
        queues += [[(t, ps[i: i + chunk]) for i in range(0, len(ps), chunk)] for t, ps in sorted(by_temp.items())]
    out = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def run_generation(engine, folder: Path, split: str, jobs: list[tuple[float, list[dict]]], *, max_tokens: int,
                   info: dict, log=print) -> None:
    """Answer every planned chunk not cached yet, cutting shards as answers accumulate."""
    cache_dir, answers_dir = Path(folder) / "cache" / split, Path(folder) / "answers" / split
    done = {s.id for s in Cache(cache_dir).samples} if (cache_dir / "meta.json").exists() else set()
    done |= shard_ids(answers_dir)  # answered on another machine: `featurize` brings them into this cache
    for i, (temp, prompts) in enumerate(jobs):
        todo = [p for p in prompts if f"{p['id']}@{temp:g}" not in done]
        if todo:
            log(f"{split}: chunk {i + 1}/{len(jobs)}, {len(todo)} prompts at T={temp:g}")
            generate_cache(engine, todo, cache_dir, temperatures=[temp], max_tokens=max_tokens, seed=i * 100_003)
            cut_shards(cache_dir, answers_dir, info=info)
    cut_shards(cache_dir, answers_dir, final=True, info=info)
