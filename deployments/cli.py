"""The `dspark` command line: generate offline, train and calibrate a drafter, serve the OpenAI API."""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from contextlib import nullcontext
from pathlib import Path

from deployments.config import LLMServingConfig
from draft_service.pipeline import DEFAULT_TAPS, calibrate, parse_temperatures, train_drafter
from draft_service.train import TrainConfig
from engine import LLM, EngineConfig, SamplingParams
from engine.loader import resolve_model

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
    p.add_argument("--speculation", default=None,
                   help="off | fixed:K | threshold:C | adaptive, the last three optionally +lookup")
    p.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=None,
                   help="batch-invariant kernels: a greedy answer is the same whatever else is in the batch "
                   "(default: on wherever the CPU kernels run; see docs/design.md)")


def cmd_generate(args: argparse.Namespace) -> int:
    llm = LLM(model=args.model, dtype=args.dtype, device=args.device, deterministic=args.deterministic,
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
    tc = TrainConfig(layers=args.layers, markov_rank=args.markov_rank, gamma=args.gamma,
                     draft_vocab_size=args.draft_vocab, anchors_per_sample=args.anchors,
                     samples_per_step=args.samples_per_step, steps=args.steps, lr=args.lr, seed=args.seed,
                     mask_token_id=args.mask_token_id, init_from=args.init_from,
                     copy_hint_ngram=list(args.copy_hints) if args.copy_hints else None)
    taps = [int(t) for t in args.taps.split(",")] if args.taps else DEFAULT_TAPS
    temps = parse_temperatures(args.temperatures)
    final = train_drafter(Path(args.out), model=args.model, prompts=args.prompts, eval_prompts=args.eval_prompts,
                          temperatures=temps, max_tokens=args.max_tokens, tap_layers=taps, tc=tc,
                          max_prompts=args.max_prompts, gen_threads=args.gen_threads,
                          cache=Path(args.cache) if args.cache else None)
    print(f"drafter written to {final}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    result = calibrate(Path(args.drafter), Path(args.cache), model=args.model,
                       check_cache_dir=Path(args.check_cache) if args.check_cache else None)
    keys = ("temperatures", "accepted", "ece_check_before", "ece_check_after")
    print(json.dumps({k: result[k] for k in keys}, indent=1))
    return 0


def single_machine_sizing(replicas: int, torch_threads: int | None = None) -> dict:
    """Serving config fields for `dspark serve` on this machine alone: each replica's engine gets its share of the
    cores (all of them for one replica), and the draft actor, whose work alternates with its engine's, shares them
    with the same number of threads instead of reserving a core that idles while the engine computes."""
    threads = torch_threads or max(1, len(os.sched_getaffinity(0)) // replicas)
    return {"torch_threads": threads, "llm": {"ray_actor_options": {"num_cpus": threads}},
            "draft_actor": {"num_cpus": 0, "num_threads": threads}}


def gpu_sizing(num_gpus: float, drafter_mode: str) -> dict:
    """Serving config fields for `--num-gpus` GPUs per replica: with a draft actor, the replica and its actor take
    half each, so both land on the same GPU (one placement bundle holds the replica's share and the actor's)."""
    if not num_gpus:
        return {}
    share = num_gpus / 2 if drafter_mode == "actor" else num_gpus
    return {"llm": {"ray_actor_options": {"num_gpus": share}},
            **({"draft_actor": {"num_gpus": share}} if drafter_mode == "actor" else {})}


def merge(base: dict, extra: dict) -> dict:
    """`base` with `extra`'s keys set, nested dicts merged."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def serving_config(args: argparse.Namespace) -> LLMServingConfig:
    """The serving config `dspark serve` deploys: the engine flags, and each replica's resources (sized to this
    machine without --address; from the config's defaults on a cluster), plus --num-gpus."""
    engine = EngineConfig(model=args.model, dtype=args.dtype, device=args.device,
                          drafter=None if args.drafter in (None, "none") else args.drafter,
                          speculation=args.speculation, enable_prefix_caching=args.enable_prefix_caching,
                          deterministic=args.deterministic,
                          **({"max_num_seqs": args.max_num_seqs} if args.max_num_seqs else {}))
    drafter_mode = "none" if engine.drafter is None else args.drafter_mode
    defaults = {name: LLMServingConfig.model_fields[name].get_default(call_default_factory=True).model_dump()
                for name in ("llm", "draft_actor")}
    sizing = merge(defaults, {} if args.address else single_machine_sizing(args.replicas, args.torch_threads))
    sizing = merge(sizing, gpu_sizing(args.num_gpus, drafter_mode))
    return LLMServingConfig(engine=engine, num_replicas=args.replicas, drafter_mode=drafter_mode,
                            served_model_name=args.served_model_name, ingress_mode=args.ingress_mode, **sizing)


def cmd_serve(args: argparse.Namespace) -> int:
    """Deploy the OpenAI-compatible app (deployments/app.py) and serve until Ctrl-C / SIGTERM."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local dev cluster; set before Ray is imported
    import ray
    from ray import serve

    from deployments.launch import run_app, serve_environment  # imports Ray Serve: here, after the line above

    resolve_model(args.model)  # a wrong --model fails here, not in replicas that Serve keeps restarting
    config = serving_config(args)
    if args.num_gpus and not args.address:
        import torch

        if torch.cuda.device_count() < args.num_gpus * args.replicas:
            print(f"dspark serve: --num-gpus {args.num_gpus} x {args.replicas} replica(s) needs that many GPUs; this "
                  f"machine has {torch.cuda.device_count()} that torch can use", file=sys.stderr)
            return 2

    def stop(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    started_serve = False
    # A cluster's own `ray start` environment decides its HTTP front (cluster.yaml); locally, serve_environment does.
    with nullcontext() if args.address else serve_environment(args.http_proxy):
        try:
            # "local" always starts a fresh cluster owned by this process, which ray.shutdown() then stops.
            local = {}
            if not args.address:  # logical CPUs: enough for every replica's bundle even on a small machine
                need = args.replicas * config.replica_bundle()["CPU"] + 1
                local["num_cpus"] = args.num_cpus or max(os.cpu_count() or 1, int(need + 0.999))
            ray.init(address=args.address or "local", include_dashboard=False, logging_level=logging.WARNING,
                     log_to_driver=args.verbose, **local)
            signal.signal(signal.SIGTERM, stop)  # again: Ray's core worker installs its own SIGTERM handler
            signal.signal(signal.SIGINT, stop)
            serve.start(http_options={"host": args.host, "port": args.port})
            started_serve = True
            run_app(config, args.port, name=args.app_name, host=host)  # fails if another server shares the port
            print(f"dspark: serving {config.model_name} at http://{host}:{args.port}/v1  (Ctrl-C to stop)", flush=True)
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("dspark: shutting down", file=sys.stderr, flush=True)
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the cleanup
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if ray.is_initialized():
                try:
                    if started_serve and args.address:
                        serve.delete(args.app_name)  # a shared cluster: remove only our app
                    elif started_serve:
                        serve.shutdown()
                finally:
                    ray.shutdown()
    return 0


def build_parser() -> argparse.ArgumentParser:
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
    tr.add_argument("--gen-threads", type=int, default=None, help="torch threads while the target generates")
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
    tr.add_argument("--init-from", default=None,
                    help="warm start from this drafter folder; extra --layers start as identities on top")
    tr.add_argument("--cache", default=None, help="caches of the target's answers (default: OUT/cache; reused)")
    tr.add_argument("--copy-hints", type=int, nargs=2, metavar=("MIN_N", "MAX_N"), default=None,
                    help="the drafter reads prompt lookup's proposals by n-grams of MIN_N..MAX_N tokens")
    tr.set_defaults(func=cmd_train_drafter)

    cal = sub.add_parser("calibrate", help="fit Sequential Temperature Scaling for a drafter's confidences")
    cal.add_argument("--drafter", required=True)
    cal.add_argument("--cache", required=True, help="a cache folder of the target's answers (train-drafter makes it)")
    cal.add_argument("--check-cache", default=None,
                     help="answers that decide which positions keep their temperature (default: half of --cache)")
    cal.add_argument("--model", default=None)
    cal.set_defaults(func=cmd_calibrate)

    srv = sub.add_parser("serve", help="serve an OpenAI-compatible API with Ray Serve")
    _add_engine_args(srv)
    srv.set_defaults(drafter="default")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--replicas", type=int, default=1)
    srv.add_argument("--drafter-mode", default="actor", choices=["actor", "in_process", "none"],
                     help="actor: a co-located draft actor per replica; in_process: inside the engine")
    srv.add_argument("--ingress-mode", default="in_replica", choices=["separate", "in_replica"],
                     help="in_replica: each replica serves HTTP itself (a hop and a process fewer per streamed "
                          "delta; a replica that dies cuts its streams); separate: an ingress deployment in front "
                          "of the replicas (a dying replica's requests get an OpenAI error)")
    srv.add_argument("--http-proxy", default="haproxy", choices=["haproxy", "ray"],
                     help="the local cluster's HTTP front: haproxy (Ray Serve's HAProxy: each connection goes "
                          "straight to a replica's own HTTP server) or ray (Serve's Python proxy, which relays every "
                          "streamed chunk as a Ray message). With --address, the cluster's `ray start` decides")
    srv.add_argument("--torch-threads", type=int, default=None,
                     help="engine (and draft actor) threads per replica on a single machine (default: the cores "
                          "this process may use, shared among the replicas); with --address the Serve config's "
                          "num_cpus decides")
    srv.add_argument("--num-gpus", type=float, default=0,
                     help="GPUs per replica, shared by its engine and its draft actor (half each, in one placement "
                          "bundle); 0: CPU. With --device auto the engine then runs on that GPU")
    srv.add_argument("--address", default=None, help="an existing Ray cluster (default: start a local one)")
    srv.add_argument("--num-cpus", type=int, default=None, help="logical CPUs of the local Ray (default: all)")
    srv.add_argument("--max-num-seqs", type=int, default=None)
    srv.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                     help="share the KV blocks (and taps) of prompt prefixes computed before (vLLM's flag)")
    srv.add_argument("--served-model-name", default=None, help="the `model` clients send")
    srv.add_argument("--app-name", default="dspark")
    srv.set_defaults(func=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"dspark: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
