"""Sequential Temperature Scaling (DSpark paper, section 3.2.1) for the confidence head.

The scheduler needs calibrated *prefix survival* probabilities prod_{i<=k} c_i. STS fits one temperature per block
position, left to right: T_k minimises the ECE of the survival at position k with T_1..T_{k-1} already fixed.
c_k' = sigmoid(logit_k / T_k) is monotone in c_k, so the order of confidences at a position is kept.
The temperatures are saved beside the checkpoint (calibration.json) and applied when the drafter loads.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

CALIBRATION_FILE = "calibration.json"
GRID = np.exp(np.linspace(np.log(0.1), np.log(10.0), 161))


def ece(pred: np.ndarray, label: np.ndarray, bins: int = 15) -> float:
    """Expected calibration error with equal-width bins."""
    if len(pred) == 0:
        return 0.0
    idx = np.minimum((pred * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        sel = idx == b
        if sel.any():
            total += sel.sum() * abs(pred[sel].mean() - label[sel].mean())
    return float(total / len(pred))


def survival(logits: np.ndarray, temps: np.ndarray) -> np.ndarray:
    """logits [N, G] -> prod_{i<=k} sigmoid(logit_i / T_i), [N, G]."""
    return np.cumprod(1.0 / (1.0 + np.exp(-logits / temps[None, :])), axis=1)


def fit_sts(logits: np.ndarray, accept_prefix: np.ndarray, valid: np.ndarray) -> dict:
    """logits, accept_prefix (1 if positions 1..k were all accepted), valid: [N, G]. Returns temperatures and the
    per-position ECE of the survival before (T = 1) and after."""
    G = logits.shape[1]
    temps = np.ones(G)
    for k in range(G):
        sel = valid[:, k]
        best, best_t = None, 1.0
        for t in GRID:
            temps[k] = t
            e = ece(survival(logits[:, : k + 1], temps[: k + 1])[sel, k], accept_prefix[sel, k])
            if best is None or e < best - 1e-12:
                best, best_t = e, t
        temps[k] = best_t
    return {"method": "sequential_temperature_scaling", "temperatures": temps.tolist(),
            "ece_before": survival_ece(logits, accept_prefix, valid, np.ones(G)),
            "ece_after": survival_ece(logits, accept_prefix, valid, temps), "num_blocks": int(len(logits))}


def survival_ece(logits, accept_prefix, valid, temps) -> list[float]:
    s = survival(logits, temps)
    return [ece(s[valid[:, k], k], accept_prefix[valid[:, k], k]) for k in range(logits.shape[1])]


def stack_records(records: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenate evaluate() records into (confidence logits, accepted-prefix labels, valid) arrays."""
    z = torch.cat([r["conf_logits"] for r in records]).double().numpy()
    y = torch.cat([r["accept_prefix"] for r in records]).numpy().astype(float)
    v = torch.cat([r["valid"] for r in records]).numpy().astype(bool)
    return z, y, v


def save_calibration(folder: Path, result: dict) -> None:
    (Path(folder) / CALIBRATION_FILE).write_text(json.dumps(result, indent=1))


def load_temperatures(folder: Path) -> list[float] | None:
    path = Path(folder) / CALIBRATION_FILE
    if not path.exists():
        return None
    return json.loads(path.read_text())["temperatures"]
