"""`dspark train-drafter` and `dspark calibrate`: data -> training -> calibration -> a drafter folder."""
from __future__ import annotations

import json
import logging
import lzma
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from draft_service.calibrate import fit_sts, save_calibration, stack_records, survival_ece
from draft_service.data import Cache, generate_cache
from draft_service.model import DSparkDrafter
from draft_service.prompts import load_prompts
from draft_service.train import TrainConfig, evaluate, local_index, train
from engine import EngineConfig, LLMEngine
from engine.loader import resolve_model

log = logging.getLogger(__name__)
DEFAULT_TAPS = [1, 8, 15, 22, 28]  # SmolLM2-135M (30 layers): spread over depth, never the last layer
CALIBRATION_EVERY = 25  # every 25th training answer is kept out of training and used to fit STS


def load_prompt_file(name: str) -> list[dict]:
    path = Path(name)
    if not path.exists():
        return load_prompts(name)
    text = lzma.decompress(path.read_bytes()).decode() if path.suffix == ".xz" else path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def parse_temperatures(text: str) -> list[tuple[float, float]]:
    """"0,0.7@0.4" -> [(0.0, 1.0), (0.7, 0.4)]: answer all prompts greedily and 40% of them at T=0.7."""
    out = []
    for part in text.split(","):
        temp, _, frac = part.partition("@")
        out.append((float(temp), float(frac) if frac else 1.0))
    return out


def train_drafter(out: Path, *, model: str | None, prompts: str, eval_prompts: str,
                  temperatures: list[tuple[float, float]],
                  max_tokens: int, tap_layers: list[int], tc: TrainConfig, release_dtype=torch.bfloat16,
                  max_prompts: int | None = None, gen_threads: int | None = None, cache: Path | None = None) -> Path:
    """Generate (or reuse) the caches, train (or resume), calibrate, and write out/drafter. Returns that folder."""
    from transformers import AutoModelForCausalLM

    out = Path(out)
    cache = Path(cache) if cache else out / "cache"
    caches = {"train": cache / "train", "heldout": cache / "heldout"}
    jobs = {"train": (load_prompt_file(prompts), temperatures), "heldout": (load_prompt_file(eval_prompts), [(0.0, 1.0)])}
    engine = None
    threads = torch.get_num_threads()
    if gen_threads:  # one thread keeps generation steady on a machine shared with other work
        torch.set_num_threads(gen_threads)
    for split, (items, temps) in jobs.items():
        items = items[:max_prompts] if max_prompts else items
        for temp, fraction in temps:  # each temperature answers the first `fraction` of the (shuffled) prompts
            subset = items[: max(1, round(len(items) * fraction))]
            done = {s.id for s in Cache(caches[split]).samples} if (caches[split] / "meta.json").exists() else set()
            if any(f"{p['id']}@{temp:g}" not in done for p in subset):
                engine = engine or LLMEngine(EngineConfig(model=model, tap_layers=tap_layers, max_num_seqs=64))
                generate_cache(engine, subset, caches[split], temperatures=[temp], max_tokens=max_tokens)
    del engine
    torch.set_num_threads(threads)

    path = resolve_model(model)
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    eos = target.generation_config.eos_token_id
    eos = eos if isinstance(eos, list) else [eos]
    train_cache, heldout = Cache(caches["train"]), Cache(caches["heldout"])
    calib_samples = train_cache.samples[::CALIBRATION_EVERY]
    train_cache.samples = [s for i, s in enumerate(train_cache.samples) if i % CALIBRATION_EVERY]
    drafter = train(target, train_cache, heldout, out, tc, tap_layers, eos, log=log.info)

    to_local = local_index(drafter)
    # STS fit on the calibration answers (all temperatures: they are contexts the drafter meets in service), each
    # position's temperature kept only where it lowers the held-out greedy answers' ECE.
    fit_split = stack_records(evaluate(drafter, train_cache, calib_samples, to_local)["records"])
    report = evaluate(drafter, heldout, [s for s in heldout.samples if s.temperature == 0.0], to_local,
                      max_anchors=10**6)
    zh, yh, vh = stack_records(report.pop("records"))
    calibration = fit_sts(fit_split, (zh, yh, vh))
    calibration["heldout_ece_before"] = survival_ece(zh, yh, vh, np.ones(zh.shape[1]))
    calibration["heldout_ece_after"] = survival_ece(zh, yh, vh, np.array(calibration["temperatures"]))
    final = out / "drafter"
    drafter.save_pretrained(final, include_embeddings=False, dtype=release_dtype)
    save_calibration(final, calibration)
    summary = {"heldout_tau": report["tau"], "heldout_accept_by_pos": report["accept_rate_by_pos"],
               "heldout_anchors": report["anchors"], "train_config": asdict(tc), "tap_layers": tap_layers,
               "train_answers": len(train_cache.samples), "calibration_answers": len(calib_samples),
               "calibration": calibration}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    log.info("held-out greedy tau %.3f over %d anchors", report["tau"], report["anchors"])
    return final


def split_by_prompt(samples: list) -> tuple[list, list]:
    """Answers split in two by prompt (an answer's id is "prompt@temperature"): every other prompt goes to the second
    half, so no prompt is in both."""
    prompts = sorted({s.id.rsplit("@", 1)[0] for s in samples})
    second = set(prompts[1::2])
    return ([s for s in samples if s.id.rsplit("@", 1)[0] not in second],
            [s for s in samples if s.id.rsplit("@", 1)[0] in second])


def calibrate(drafter_dir: Path, cache_dir: Path, model: str | None = None,
              check_cache_dir: Path | None = None) -> dict:
    """Fit STS for an existing drafter on a cache of the target's answers, checking each position's temperature on
    `check_cache_dir` (default: half of the cache's prompts, the other half fits); write calibration.json beside it."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=torch.float32).eval()
    drafter = DSparkDrafter.from_pretrained(drafter_dir, target_embed=target.get_input_embeddings().weight,
                                            target_lm_head=target.get_output_embeddings().weight,
                                            dtype=torch.float32)
    drafter.conf_temperatures = None  # fit from the raw logits
    cache = Cache(cache_dir)
    to_local = local_index(drafter)
    if check_cache_dir is None:
        fit_samples, check_samples = split_by_prompt(cache.samples)
        check_cache = cache
    else:
        fit_samples, check_cache = cache.samples, Cache(check_cache_dir)
        check_samples = check_cache.samples
    fit_split = stack_records(evaluate(drafter, cache, fit_samples, to_local)["records"])
    check_split = stack_records(evaluate(drafter, check_cache, check_samples, to_local)["records"])
    result = fit_sts(fit_split, check_split)
    save_calibration(drafter_dir, result)
    return result
