"""The `dspark` command line."""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time

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
