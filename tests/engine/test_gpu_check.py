"""bench/gpu_check.py, the prepared GPU check, runs its whole code path on CPU (tiny shapes), so that it works when
a GPU is lent for a few minutes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_on_cpu_and_reports(tmp_path):
    env = {**os.environ, "DSPARK_KERNELS": "torch", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu", "--quick",
                          "--out", str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["ok"] and report["equality_fp32"]["cpu_vs_device"]["identical"] == 6
    assert report["equality_fp32"]["device_vs_device_fixed3"]["identical"] == 6  # speculation is lossless
    assert report["equality_fp32"]["device_vs_device_sdpa"]["identical"] == 6
    assert report["cuda_ipc"] == {"ok": None, "why": "needs a GPU"}
    tiny = report["shapes"]["tiny"]
    assert tiny["sampling"]["ok"] and tiny["sampling"]["draft_tokens"] > 0
    assert set(tiny["steps"]) == {"off@1", "fixed:3@1", "off@4", "fixed:3@4"}
    assert all(s["tokens_per_step"] >= 1.0 and s["ms_per_step"] > 0 for s in tiny["steps"].values())
    assert tiny["sps"] and tiny["draft_round_ms"]
