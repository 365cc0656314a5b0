"""The `dspark` command line."""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

DEFAULT_QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
]


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF folder or .gguf file (default: SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16 | float64")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--drafter", default=None, help="'default', a drafter folder, or 'none'")
    p.add_argument("--speculation", default=None, help="off | fixed:K | threshold:C | adaptive")


def cmd_generate(args: argparse.Namespace) -> int:
    from engine import LLM, SamplingParams

    llm = LLM(model=args.model, dtype=args.dtype, device=args.device,
              **({"drafter": args.drafter} if args.drafter else {}),
              **({"speculation": args.speculation} if args.speculation else {}))
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.seed)
    prompts = args.prompt or DEFAULT_QUESTIONS
    if args.raw:
        inputs = prompts
    else:
        inputs = [llm.apply_chat_template([{"role": "user", "content": p}]) for p in prompts]
    t0 = time.perf_counter()
    outputs = llm.generate(inputs, params)
    elapsed = time.perf_counter() - t0
    for prompt, out in zip(prompts, outputs):
        if args.json:
            print(json.dumps({"prompt": prompt, "text": out.text, "finish_reason": out.finish_reason,
                              "metrics": out.metrics}))
        else:
            print(f"### {prompt}\n{out.text}\n[{out.finish_reason}, {len(out.token_ids)} tokens]\n")
    n = sum(len(o.token_ids) for o in outputs)
    print(f"{len(outputs)} requests, {n} tokens in {elapsed:.2f} s ({n / elapsed:.1f} tokens/s)", file=sys.stderr)
    return 0


def cmd_train_drafter(args: argparse.Namespace) -> int:
    from draft_service.pipeline import DEFAULT_TAPS, parse_temperatures, train_drafter
    from draft_service.train import TrainConfig

    tc = TrainConfig(layers=args.layers, markov_rank=args.markov_rank, gamma=args.gamma,
                     draft_vocab_size=args.draft_vocab, anchors_per_sample=args.anchors,
                     samples_per_step=args.samples_per_step, steps=args.steps, lr=args.lr, seed=args.seed,
                     mask_token_id=args.mask_token_id)
    taps = [int(t) for t in args.taps.split(",")] if args.taps else DEFAULT_TAPS
    temps = parse_temperatures(args.temperatures)
    final = train_drafter(Path(args.out), model=args.model, prompts=args.prompts, eval_prompts=args.eval_prompts,
                          temperatures=temps, max_tokens=args.max_tokens, tap_layers=taps, tc=tc,
                          max_prompts=args.max_prompts)
    print(f"drafter written to {final}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from draft_service.pipeline import calibrate

    result = calibrate(Path(args.drafter), Path(args.cache), model=args.model)
    print(json.dumps({k: result[k] for k in ("temperatures", "ece_before", "ece_after")}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dspark", description="DSpark speculative decoding engine and server")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate completions offline")
    _add_engine_args(gen)
    gen.add_argument("--prompt", action="append", help="a prompt (repeatable); default: a few sample questions")
    gen.add_argument("--raw", action="store_true", help="send prompts as-is, without the chat template")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--json", action="store_true", help="one JSON line per prompt")
    gen.set_defaults(func=cmd_generate)

    tr = sub.add_parser("train-drafter", help="distil a DSpark drafter from the target's own answers")
    tr.add_argument("--out", required=True, help="run folder: caches, checkpoint.pt, drafter/, summary.json")
    tr.add_argument("--model", default=None, help="target (default: SmolLM2-135M-Instruct)")
    tr.add_argument("--prompts", default="train", help="a jsonl file, or a split of data/prompts")
    tr.add_argument("--eval-prompts", default="heldout")
    tr.add_argument("--temperatures", default="0,0.7@0.4",
                    help="answer the prompts at these temperatures; T@F answers only the first fraction F")
    tr.add_argument("--max-tokens", type=int, default=256)
    tr.add_argument("--max-prompts", type=int, default=None, help="use only the first N prompts of each split")
    tr.add_argument("--taps", default=None, help="target layer ids, e.g. 1,8,15,22,28")
    tr.add_argument("--layers", type=int, default=1)
    tr.add_argument("--markov-rank", type=int, default=64)
    tr.add_argument("--gamma", type=int, default=7)
    tr.add_argument("--draft-vocab", type=int, default=16384)
    tr.add_argument("--anchors", type=int, default=48, help="anchor blocks per answer per step")
    tr.add_argument("--samples-per-step", type=int, default=8)
    tr.add_argument("--steps", type=int, default=3000)
    tr.add_argument("--lr", type=float, default=6e-4)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--mask-token-id", type=int, default=16, help="an id the target never emits (<empty_output>)")
    tr.set_defaults(func=cmd_train_drafter)

    cal = sub.add_parser("calibrate", help="fit Sequential Temperature Scaling for a drafter's confidences")
    cal.add_argument("--drafter", required=True)
    cal.add_argument("--cache", required=True, help="a cache folder of the target's answers (train-drafter makes it)")
    cal.add_argument("--model", default=None)
    cal.set_defaults(func=cmd_calibrate)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"dspark: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
