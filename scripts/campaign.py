"""Drive the drafter campaign (draft_service/campaign.py) across sittings. Every command resumes.

    python scripts/campaign.py plan --folder runs/campaign --prompts train=train mined=runs/campaign/prompts/mined.jsonl
    nice -n 19 python scripts/campaign.py generate --folder runs/campaign     # background: answers -> cache + shards
    python scripts/campaign.py featurize --folder runs/campaign               # a new machine: shards -> cache
    nice -n 19 python scripts/campaign.py train --folder runs/campaign --steps 6000
    nice -n 19 python scripts/campaign.py train --folder runs/campaign --run hints1 \
        --init-from draft_service/weights/smollm2-135m-instruct --copy-hints 2 3  # warm start, with copy hints
    python scripts/campaign.py status --folder runs/campaign
    python scripts/campaign.py export --folder runs/campaign --run hints1 --out runs/campaign/hints1-drafter
    python scripts/campaign.py snapshot --folder runs/campaign     # plan + shards -> data/campaign (to commit)
    python scripts/campaign.py snapshot --folder runs/campaign --run hints1   # and the run's weights (bf16, to commit)
    python scripts/campaign.py restore --folder runs/campaign      # a new machine: data/campaign -> the folder

A run whose folder is gone (a new machine) goes on from its committed weights-only snapshot, data/campaign/runs/RUN:
`train --run RUN` finds it there, keeps its step count and learning-rate schedule, and starts the optimizer afresh.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from draft_service.campaign import (cut_shards, featurize, load_manifest, plan_jobs, run_generation,  # noqa: E402
                                    TOP_P)
from draft_service.data import Cache  # noqa: E402
from draft_service.pipeline import DEFAULT_TAPS, load_prompt_file  # noqa: E402

log = logging.getLogger("campaign")


def cmd_plan(args) -> None:
    folder = Path(args.folder)
    sets = dict(item.split("=", 1) for item in args.prompts)
    plan = {"prompt_sets": {}, "heldout": args.heldout, "mix": [[float(t), float(s)] for t, s in
                                                                 (m.split("@") for m in args.mix.split(","))],
            "max_tokens": args.max_tokens, "tap_layers": DEFAULT_TAPS, "chunk": args.chunk, "model": args.model}
    for name, source in sets.items():
        prompts = load_prompt_file(source)
        digest = hashlib.sha256("".join(json.dumps(p) for p in prompts).encode()).hexdigest()
        plan["prompt_sets"][name] = {"source": source, "prompts": len(prompts), "sha256": digest}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plan.json").write_text(json.dumps(plan, indent=1))
    print(json.dumps(plan, indent=1))


def load_plan(folder: Path) -> dict:
    plan = json.loads((folder / "plan.json").read_text())
    for name, entry in plan["prompt_sets"].items():
        prompts = load_prompt_file(entry["source"])
        digest = hashlib.sha256("".join(json.dumps(p) for p in prompts).encode()).hexdigest()
        if digest != entry["sha256"]:
            raise SystemExit(f"prompt set {name} ({entry['source']}) changed since the plan was made")
        entry["items"] = prompts
    return plan


def cmd_generate(args) -> None:
    from engine import EngineConfig, LLMEngine

    folder = Path(args.folder)
    plan = load_plan(folder)
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = LLMEngine(EngineConfig(model=plan["model"], tap_layers=plan["tap_layers"], max_num_seqs=args.batch))
    info = {"target": Path(engine.model_path).name, "target_dtype": str(engine.dtype).removeprefix("torch."),
            "tap_layers": plan["tap_layers"], "max_tokens": plan["max_tokens"], "top_p_when_sampled": TOP_P}
    heldout = load_prompt_file(plan["heldout"])
    run_generation(engine, folder, "heldout", [(0.0, heldout)], max_tokens=plan["max_tokens"],
                   info={**info, "prompts": plan["heldout"]}, log=log.info)
    jobs = plan_jobs({k: v["items"] for k, v in plan["prompt_sets"].items()},
                     [tuple(m) for m in plan["mix"]], plan["chunk"])
    run_generation(engine, folder, "train", jobs, max_tokens=plan["max_tokens"],
                   info={**info, "prompt_sets": {k: {kk: vv for kk, vv in v.items() if kk != "items"}
                                                 for k, v in plan["prompt_sets"].items()}, "mix": plan["mix"]},
                   log=log.info)


def cmd_featurize(args) -> None:
    from transformers import AutoModelForCausalLM

    from engine.loader import resolve_dtype, resolve_model

    folder = Path(args.folder)
    plan = json.loads((folder / "plan.json").read_text())
    # The engine's own choice: bf16 where the CPU has native bf16 (where the answers came from), else float32,
    # which without native bf16 runs the target many times faster at a near-equal result.
    dtype = resolve_dtype(args.dtype, torch.device("cpu"))
    log.info("featurizing with the target in %s", dtype)
    target = AutoModelForCausalLM.from_pretrained(resolve_model(plan["model"]), dtype=dtype).eval()
    for split in ("heldout", "train"):
        n = featurize(folder / "answers" / split, folder / "cache" / split, target, plan["tap_layers"], log=log.info)
        log.info("%s: %d answers featurized", split, n)


def cmd_train(args) -> None:
    from transformers import AutoModelForCausalLM

    from draft_service.train import TrainConfig, train
    from engine.loader import resolve_model

    folder = Path(args.folder)
    plan = json.loads((folder / "plan.json").read_text())
    if args.threads:
        torch.set_num_threads(args.threads)
    target = AutoModelForCausalLM.from_pretrained(resolve_model(plan["model"]), dtype=torch.float32).eval()
    eos = target.generation_config.eos_token_id
    init_from, start_step = args.init_from, 0
    snapshot = SNAPSHOT / "runs" / args.run
    if not (folder / "train" / args.run / "checkpoint.pt").exists() and (snapshot / "model.safetensors").exists():
        start_step = json.loads((snapshot / "training_summary.json").read_text())["step"]
        init_from = str(snapshot)
        log.info("run %s: no checkpoint here; going on from its snapshot at step %d", args.run, start_step)
    tc = TrainConfig(layers=args.layers, steps=args.steps, lr=args.lr, draft_vocab_size=args.draft_vocab,
                     init_from=init_from, mask_token_id=16, eval_every=args.eval_every,
                     checkpoint_every=args.eval_every, copy_hint_ngram=args.copy_hints)
    train(target, Cache(folder / "cache" / "train"), Cache(folder / "cache" / "heldout"), folder / "train" / args.run,
          tc, plan["tap_layers"], eos if isinstance(eos, list) else [eos], log=log.info, stop_after=args.stop_after,
          follow=args.follow, start_step=start_step)


def cmd_export(args) -> None:
    """A run's latest checkpoint as a drafter folder (bf16, as the default ships), with its training summary."""
    export_run(Path(args.folder), args.run, Path(args.out))


def export_run(folder: Path, run: str, out: Path) -> None:
    from transformers import AutoModelForCausalLM

    from draft_service.train import export_checkpoint
    from engine.loader import resolve_model

    plan = json.loads((folder / "plan.json").read_text())
    target = AutoModelForCausalLM.from_pretrained(resolve_model(plan["model"]), dtype=torch.float32).eval()
    summary = export_checkpoint(target, folder / "train" / run / "checkpoint.pt", out, plan["tap_layers"])
    answers = {split: len(Cache(folder / "cache" / split).samples) for split in ("heldout", "train")}
    summary = {**summary, "tap_layers": plan["tap_layers"], "answers_cached": answers, "run": run}
    (out / "training_summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: summary[k] for k in ("step", "heldout_tau", "answers_cached")}))


def cmd_status(args) -> None:
    folder = Path(args.folder)
    for split in ("heldout", "train"):
        manifest = load_manifest(folder / "answers" / split)
        cache = folder / "cache" / split
        cached = len(Cache(cache).samples) if (cache / "meta.json").exists() else 0
        print(f"{split}: {sum(s['answers'] for s in manifest['shards'])} answers in {len(manifest['shards'])} shards "
              f"({sum(s['response_tokens'] for s in manifest['shards'])} response tokens); {cached} cached")


SNAPSHOT = ROOT / "data" / "campaign"


def copy_durable(src: Path, dst: Path) -> None:
    """The plan and the answer shards (never the caches), skipping shards already there."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src / "plan.json", dst / "plan.json")
    for split_dir in sorted((src / "answers").glob("*")):
        out = dst / "answers" / split_dir.name
        out.mkdir(parents=True, exist_ok=True)
        for shard in sorted(split_dir.glob("shard-*.npz")):
            if not (out / shard.name).exists():
                shutil.copy2(shard, out / shard.name)
        shutil.copy2(split_dir / "manifest.json", out / "manifest.json")  # last: it lists only shards present


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--folder", required=True)
    p.add_argument("--prompts", nargs="+", required=True, help="name=source (a split name or a .jsonl path)")
    p.add_argument("--heldout", default="heldout")
    p.add_argument("--mix", default="0@0.5,0.7@0.25,1.0@0.25", help="T@share,...: each prompt gets one temperature")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--chunk", type=int, default=128)
    p.add_argument("--model", default=None, help="the target (default: the packaged SmolLM2-135M-Instruct)")
    for name in ("generate", "featurize", "train", "status", "cut", "snapshot", "restore", "export"):
        q = sub.add_parser(name)
        q.add_argument("--folder", required=True)
        q.add_argument("--threads", type=int, default=None)
        q.add_argument("--dtype", default="auto", help="featurize: the target's dtype (auto: the engine's choice)")
        q.add_argument("--batch", type=int, default=64)
        q.add_argument("--run", default=None, help="train/export: the run (default main); snapshot: add its weights")
        q.add_argument("--steps", type=int, default=6000)
        q.add_argument("--stop-after", type=int, default=None)
        q.add_argument("--layers", type=int, default=2)
        q.add_argument("--lr", type=float, default=4e-4)
        q.add_argument("--draft-vocab", type=int, default=12288)
        q.add_argument("--eval-every", type=int, default=250)
        q.add_argument("--init-from", default=None)
        q.add_argument("--follow", action="store_true",
                       help="train: reopen the training cache at each checkpoint (train while featurize still adds)")
        q.add_argument("--copy-hints", type=int, nargs=2, metavar=("MIN_N", "MAX_N"), default=None,
                       help="train with copy hints: prompt lookup's proposals over n-grams of MIN_N..MAX_N tokens")
        q.add_argument("--out", default=None, help="export: the drafter folder to write")
    args = ap.parse_args()
    if args.cmd == "cut":
        for split in ("heldout", "train"):
            cut_shards(Path(args.folder) / "cache" / split, Path(args.folder) / "answers" / split, final=True)
        return
    if args.cmd in ("snapshot", "restore"):
        folder = Path(args.folder)
        copy_durable(*((folder, SNAPSHOT) if args.cmd == "snapshot" else (SNAPSHOT, folder)))
        if args.cmd == "snapshot" and args.run:
            export_run(folder, args.run, SNAPSHOT / "runs" / args.run)
        return
    if args.cmd in ("train", "export"):
        args.run = args.run or "main"
    {"plan": cmd_plan, "generate": cmd_generate, "featurize": cmd_featurize, "train": cmd_train,
     "status": cmd_status, "export": cmd_export}[args.cmd](args)


if __name__ == "__main__":
    main()
