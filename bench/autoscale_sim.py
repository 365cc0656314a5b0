"""A day of diurnal traffic against an autoscaled dspark fleet and against a fixed fleet sized for the peak.

Both fleets run the fleet simulator (autoscale/simulator.py: the engine's verify-length controller inside every
simulated step, the Serve policy's `decide` every control interval) on the same trace: a raised cosine from 5% of
the peak at midnight to the peak at noon, with slow noise (the same noise path for both), Poisson arrivals,
lognormal prompt and output lengths (autoscale/trace.py). The fixed fleet has as many replicas as the autoscaled
one needed at its peak (or --fixed N). --hours below 24 compresses the same day (steeper ramps: a harder test).

The replica profile (step-cost curves, acceptance) is ASSUMED (an H100 with a ~4B model, see
autoscale.simulator.ASSUMED_PROFILE) unless --profile names measured numbers: a JSON with forward_grid/forward_ms/
draft_grid/draft_ms/acceptance, or bench/results/drafter_report.json (target_step_ms, draft_round_ms,
conditional_accept_by_pos; `--profile measured` picks it). Those are this project's CPU measurements of the default
model, a very different replica from the GPU one the fleet numbers are about (and the forward curve is extrapolated
linearly past its last point: match --max-num-seqs / --token-budget to what was measured).

At most --simulate replicas are simulated one by one; a larger fleet is represented by them (mean field), and its
GPU-hours come from the full replica count. The JSON records what was simulated.

    .venv/bin/python bench/autoscale_sim.py                 # a full day, peak 3000 req/s
    .venv/bin/python bench/autoscale_sim.py --hours 2 --peak 300 --simulate 2   # a compressed day, to check it runs
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def load_profile(arg: str | None) -> dict:
    from autoscale.simulator import ASSUMED_PROFILE

    if arg is None:
        return dict(ASSUMED_PROFILE)
    path = RESULTS / "drafter_report.json" if arg == "measured" else Path(arg)
    data = json.loads(path.read_text())
    if "forward_ms" in data:
        return {**data, "source": str(path)}
    # bench/drafter_report.py: per-batch target decode step and draft round (ms), conditional acceptance.
    step = sorted((int(b), ms) for b, ms in data["target_step_ms"].items())
    draft = sorted((int(b), ms) for b, ms in data["draft_round_ms"].items())
    return {"source": f"measured: {path}", "forward_grid": [b for b, _ in step], "forward_ms": [m for _, m in step],
            "draft_grid": [b for b, _ in draft], "draft_ms": [m for _, m in draft],
            "acceptance": data["conditional_accept_by_pos"]}


def run(args) -> dict:
    from autoscale.policy import PolicyParams
    from autoscale.simulator import FleetSpec, ReplicaSpec, simulate
    from autoscale.trace import SyntheticTrace, diurnal

    profile = load_profile(args.profile)
    spec = ReplicaSpec.from_profile(profile, max_num_seqs=args.max_num_seqs,
                                    max_num_batched_tokens=args.token_budget)
    period = args.hours * 3600
    trace = SyntheticTrace(diurnal(peak=args.peak, trough_frac=args.trough, period_s=period, seed=args.seed), period)
    fleet = FleetSpec(max_simulated=args.simulate, stats_window_s=max(60.0, period / 96))
    policy = PolicyParams(token_budget=spec.max_num_batched_tokens, max_replicas=args.max_replicas)
    initial = max(1, math.ceil(float(trace.rate(0.0)) / args.initial_per_replica))

    t0 = time.process_time()
    auto = simulate(trace, spec, fleet, policy, replicas=initial, seed=args.seed)
    t_auto = time.process_time() - t0
    n_fixed = args.fixed or max(auto.timeline["ready"])
    t0 = time.process_time()
    fixed = simulate(trace, spec, fleet, None, replicas=n_fixed, seed=args.seed)
    t_fixed = time.process_time() - t0
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "profile": profile,
        "replica": asdict(spec),
        "fleet": asdict(fleet),
        "policy": asdict(policy),
        "trace": {"kind": "diurnal", "peak_rps": args.peak, "trough_frac": args.trough, "hours": args.hours,
                  "prompt": asdict(trace.prompt), "output": asdict(trace.output), "seed": args.seed},
        "initial_replicas": initial,
        "fixed_replicas": n_fixed,
        "cpu_seconds": {"autoscaled": t_auto, "fixed": t_fixed},
        "autoscaled": auto.to_json(),
        "fixed": fixed.to_json(),
    }


def compact(report: dict, points: int = 1500) -> dict:
    """The report for the JSON file: timelines thinned to about `points` ticks, floats to 5 significant digits
    (a day has 17280 control ticks per series; the plot uses them all)."""
    def rounded(x):
        if isinstance(x, float):
            return float(f"{x:.5g}")
        if isinstance(x, dict):
            return {k: rounded(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [rounded(v) for v in x]
        return x

    out = dict(report)
    for name in ("autoscaled", "fixed"):
        res = dict(report[name])
        stride = max(1, math.ceil(len(res["timeline"]["t"]) / points))
        res["timeline"] = {k: v[::stride] for k, v in res["timeline"].items()}
        res["timeline_stride_ticks"] = stride
        out[name] = res
    return rounded(out)


def summary_rows(report: dict) -> list[tuple]:
    rows = []
    for name in ("autoscaled", "fixed"):
        r = report[name]
        o = r["overall"]
        reps = r["timeline"]["allocated"]
        rows.append((name, r["gpu_hours"], min(reps), max(reps), float(np.mean(reps)), o["ttft_p50_s"],
                     o["ttft_p99_s"], o["tpot_p50_s"], o["tpot_p99_s"], r["completed"], r["rejected"]))
    return rows


def print_table(report: dict) -> None:
    print(f"profile: {report['profile']['source']}; trace: {report['trace']['hours']} h, peak "
          f"{report['trace']['peak_rps']:g} req/s; simulated one by one: up to {report['fleet']['max_simulated']} "
          f"replicas (the rest mean-field)")
    print(f"{'fleet':11s} {'GPU-h':>8s} {'min':>4s} {'max':>4s} {'mean':>6s} {'TTFT p50':>9s} {'TTFT p99':>9s} "
          f"{'TPOT p50':>9s} {'TPOT p99':>9s} {'simulated':>10s} {'429s':>6s}")
    for name, gh, lo, hi, mean, t50, t99, p50, p99, done, rej in summary_rows(report):
        print(f"{name:11s} {gh:8.1f} {lo:4d} {hi:4d} {mean:6.1f} {t50 * 1e3:7.0f}ms {t99 * 1e3:7.0f}ms "
              f"{p50 * 1e3:7.1f}ms {p99 * 1e3:7.1f}ms {done:10d} {rej:6d}")
    a, f = report["autoscaled"]["gpu_hours"], report["fixed"]["gpu_hours"]
    print(f"autoscaled GPU-hours: {a:.1f} vs fixed {f:.1f} ({100 * a / f:.0f}%); "
          f"{len(report['autoscaled']['decisions'])} scaling decisions")


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    auto, fixed = report["autoscaled"], report["fixed"]
    hours = np.array(auto["timeline"]["t"]) / 3600
    fig, axes = plt.subplots(4, 1, figsize=(11, 13), sharex=True)
    ax = axes[0]
    ax.plot(hours, auto["timeline"]["allocated"], label="autoscaled: replicas (GPUs held)", color="C0")
    ax.plot(hours, auto["timeline"]["ready"], label="autoscaled: serving", color="C0", lw=0.8, ls=":")
    ax.axhline(report["fixed_replicas"], color="C3", ls="--", label=f"fixed: {report['fixed_replicas']}")
    ax.set_ylabel("replicas")
    ax2 = ax.twinx()
    ax2.plot(hours, auto["timeline"]["rate"], color="0.5", lw=0.8, label="load (req/s)")
    ax2.set_ylabel("requests/s")
    ax.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    ax.set_title(f"{report['trace']['hours']} h diurnal trace, peak {report['trace']['peak_rps']:g} req/s; "
                 f"GPU-hours autoscaled {auto['gpu_hours']:.0f} vs fixed {fixed['gpu_hours']:.0f}")
    for ax, metric, title in ((axes[1], "ttft", "TTFT"), (axes[2], "tpot", "TPOT")):
        for res, name, color in ((auto, "autoscaled", "C0"), (fixed, "fixed", "C3")):
            wins = res["windows"]
            h = np.array([w["t"] for w in wins]) / 3600
            ax.plot(h, [w[f"{metric}_p50_s"] * 1e3 for w in wins], color=color, label=f"{name} p50")
            ax.plot(h, [w[f"{metric}_p99_s"] * 1e3 for w in wins], color=color, ls="--", label=f"{name} p99")
        ax.set_yscale("log")
        ax.set_ylabel(f"{title} (ms)")
        ax.legend(fontsize=8, ncol=2)
    ax = axes[3]
    tl = auto["timeline"]
    ax.plot(hours, tl["seq_occupancy"], label="seq occupancy")
    ax.plot(hours, tl["token_occupancy"], label="token occupancy")
    ax.plot(hours, tl["spec_squeezed"], label="spec squeezed")
    ax.set_ylabel("autoscaled fleet (mean)")
    ax3 = ax.twinx()
    ax3.plot(hours, tl["verify_tokens_per_seq"], color="C4", lw=0.8, label="verify tokens / seq")
    ax3.set_ylabel("verify tokens per sequence")
    ax.legend(loc="upper left", fontsize=8)
    ax3.legend(loc="upper right", fontsize=8)
    ax.set_xlabel("hour")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hours", type=float, default=24.0, help="length of the (compressed) day")
    ap.add_argument("--peak", type=float, default=3000.0, help="requests/s at the peak")
    ap.add_argument("--trough", type=float, default=0.05, help="trough as a fraction of the peak")
    ap.add_argument("--simulate", type=int, default=1,
                    help="replicas simulated one by one (the rest mean-field); more is closer and slower")
    ap.add_argument("--fixed", type=int, default=0, help="fixed fleet size (default: the autoscaled peak)")
    ap.add_argument("--max-replicas", type=int, default=1000)
    ap.add_argument("--max-num-seqs", type=int, default=256, help="each replica's engine max_num_seqs")
    ap.add_argument("--token-budget", type=int, default=2048, help="each replica's max_num_batched_tokens")
    ap.add_argument("--initial-per-replica", type=float, default=20.0,
                    help="the autoscaled fleet starts with rate(0) / this replicas")
    ap.add_argument("--profile", default=None, help="JSON of measured numbers, or 'measured' (default: assumed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="autoscale_sim")
    args = ap.parse_args()
    t0 = time.time()
    report = run(args)
    report["wall_seconds"] = time.time() - t0
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(compact(report), indent=1, default=float))
    plot(report, RESULTS / f"{args.name}.png")
    print_table(report)
    print(f"wall {report['wall_seconds']:.0f} s (cpu: autoscaled {report['cpu_seconds']['autoscaled']:.0f} s, fixed "
          f"{report['cpu_seconds']['fixed']:.0f} s); wrote {RESULTS / args.name}.json/.png")


if __name__ == "__main__":
    main()
