"""Sequential Temperature Scaling (DSpark paper, section 3.2.1) for the confidence head, checked on a second split.

The scheduler needs calibrated *prefix survival* probabilities prod_{i<=k} c_i. STS fits one temperature per block
position, left to right: T_k minimises the ECE of the survival at position k on the fit split, with T_1..T_{k-1}
already fixed. T_k is kept only if it lowers the survival ECE at k on the check split (else T_k = 1), so a position's
temperature never makes the check split's calibration worse than leaving that position alone.
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
Split = tuple[np.ndarray, np.ndarray, np.ndarray]  # (confidence logits, accepted-prefix labels, valid), each [N, G]


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


def position_ece(split: Split, temps: np.ndarray, k: int) -> float:
    """ECE of the survival at position k (0-based) under temps[:k + 1], over the blocks valid there."""
    z, y, v = split
    sel = v[:, k]
    return ece(survival(z[sel, : k + 1], temps[: k + 1])[:, k], y[sel, k])


def fit_sts(fit: Split, check: Split) -> dict:
    """Per position, left to right: the fit split's best temperature, kept only where it lowers the check split's
    ECE (else 1.0). "before" is the position with T_k = 1 and the earlier positions at their chosen temperatures;
    "after" is the chosen T_k, so check after <= check before at every position."""
    G = fit[0].shape[1]
    temps, fitted, accepted = np.ones(G), [], []
    rec = {name: [] for name in ("ece_fit_before", "ece_fit_after", "ece_check_before", "ece_check_after")}
    for k in range(G):
        temps[k] = 1.0
        fit_before, check_before = position_ece(fit, temps, k), position_ece(check, temps, k)
        best, best_t = None, 1.0
        for t in GRID:
            temps[k] = t
            e = position_ece(fit, temps, k)
            if best is None or e < best - 1e-12:
                best, best_t = e, float(t)
        temps[k] = best_t
        keep = position_ece(check, temps, k) < check_before
        temps[k] = best_t if keep else 1.0
        fitted.append(best_t)
        accepted.append(bool(keep))
        rec["ece_fit_before"].append(fit_before)
        rec["ece_fit_after"].append(position_ece(fit, temps, k))
        rec["ece_check_before"].append(check_before)
        rec["ece_check_after"].append(position_ece(check, temps, k))
    return {"method": "sequential_temperature_scaling",
            "selection": "per position: the fit split's temperature, kept only where it lowers the check split's ECE",
            "temperatures": temps.tolist(), "fitted_temperatures": fitted, "accepted": accepted, **rec,
            "num_blocks_fit": int(len(fit[0])), "num_blocks_check": int(len(check[0]))}


def survival_ece(logits, accept_prefix, valid, temps) -> list[float]:
    s = survival(logits, temps)
    return [ece(s[valid[:, k], k], accept_prefix[valid[:, k], k]) for k in range(logits.shape[1])]


def stack_records(records: list[dict]) -> Split:
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
