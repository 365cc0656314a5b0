"""Sequential Temperature Scaling with a check split (draft_service/calibrate.py) on seeded synthetic blocks, and the
committed default drafter's calibration as it loads."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from draft_service.calibrate import CALIBRATION_FILE, ece, fit_sts, survival


def blocks(rng, n: int, true_t, valid_frac: float = 1.0):
    """n blocks whose position k is accepted with probability sigmoid(z_k / true_t[k]) given that its prefix was: the
    raw confidences are miscalibrated by exactly true_t. With valid_frac < 1, some blocks end early (the answer ran
    out), as evaluate() marks them."""
    true_t = np.asarray(true_t, float)
    z = rng.normal(1.0, 2.0, size=(n, len(true_t)))
    ok = rng.random(z.shape) < 1 / (1 + np.exp(-z / true_t))
    y = np.cumprod(ok, axis=1).astype(float)
    ends = np.where(rng.random(n) < valid_frac, len(true_t), rng.integers(1, len(true_t) + 1, n))
    valid = np.arange(len(true_t))[None, :] < ends[:, None]
    return z, y, valid


def reference_ece(split, temps, k):
    z, y, v = split
    return ece(survival(z, np.asarray(temps, float))[v[:, k], k], y[v[:, k], k])


def check_record(result, fit, check):
    """The recorded ECEs are the survival ECE at each position with T_k = 1 (before) and the chosen T_k (after), the
    earlier positions at their chosen temperatures; a rejected position keeps T = 1."""
    temps = result["temperatures"]
    for k in range(len(temps)):
        unscaled = temps[:k] + [1.0] + temps[k + 1:]
        assert result["ece_fit_before"][k] == pytest.approx(reference_ece(fit, unscaled, k), abs=1e-12)
        assert result["ece_fit_after"][k] == pytest.approx(reference_ece(fit, temps, k), abs=1e-12)
        assert result["ece_check_before"][k] == pytest.approx(reference_ece(check, unscaled, k), abs=1e-12)
        assert result["ece_check_after"][k] == pytest.approx(reference_ece(check, temps, k), abs=1e-12)
        assert temps[k] == (result["fitted_temperatures"][k] if result["accepted"][k] else 1.0)


def test_consistent_miscalibration_is_accepted_and_lowers_check_ece():
    true_t = [2.0, 0.5, 3.0]
    fit, check = blocks(np.random.default_rng(1), 10000, true_t), blocks(np.random.default_rng(2), 10000, true_t)
    result = fit_sts(fit, check)
    check_record(result, fit, check)
    assert result["accepted"] == [True, True, True]
    np.testing.assert_allclose(result["temperatures"], true_t, rtol=0.2)
    for k in range(3):
        assert result["ece_check_after"][k] < 0.5 * result["ece_check_before"][k]


def test_fit_optimum_that_hurts_the_check_split_is_rejected():
    # Position 1 is overconfident by 2 in both splits; position 2 is overconfident in the fit split and underconfident
    # in the check split, so the fit's softening temperature makes the check split worse there.
    fit = blocks(np.random.default_rng(3), 10000, [2.0, 2.0])
    check = blocks(np.random.default_rng(4), 10000, [2.0, 0.5])
    result = fit_sts(fit, check)
    check_record(result, fit, check)
    assert result["accepted"] == [True, False]
    assert result["fitted_temperatures"][1] == pytest.approx(2.0, rel=0.2)  # fitted, then refused
    assert result["temperatures"][1] == 1.0
    assert result["ece_check_after"][1] == result["ece_check_before"][1]
    assert result["ece_fit_after"][1] == result["ece_fit_before"][1]


def test_check_ece_never_rises_on_random_splits():
    accepted = rejected = 0
    for seed in range(20):
        rng = np.random.default_rng(100 + seed)
        G = 4
        # Each split gets its own miscalibration per position, so the fit's optimum may or may not carry over.
        fit = blocks(rng, 1500, np.exp(rng.uniform(np.log(0.3), np.log(3.0), G)), valid_frac=0.8)
        check = blocks(rng, 1500, np.exp(rng.uniform(np.log(0.3), np.log(3.0), G)), valid_frac=0.8)
        result = fit_sts(fit, check)
        check_record(result, fit, check)
        for k in range(G):
            assert result["ece_check_after"][k] <= result["ece_check_before"][k]
        accepted += sum(result["accepted"])
        rejected += G - sum(result["accepted"])
    assert accepted > 0 and rejected > 0  # both branches ran


def test_default_drafter_loads_its_committed_calibration():
    """The committed calibration keeps a temperature only where the held-out ECE fell, and the drafter divides its
    confidence logits by those temperatures once loaded."""
    from transformers import AutoModelForCausalLM

    from draft_service.model import DSparkDrafter
    from engine.loader import DEFAULT_DRAFTER, resolve_model

    cal = json.loads((DEFAULT_DRAFTER / CALIBRATION_FILE).read_text())
    for k, t in enumerate(cal["temperatures"]):
        if cal["accepted"][k]:
            assert t == cal["fitted_temperatures"][k]
            assert cal["ece_check_after"][k] < cal["ece_check_before"][k]
        else:
            assert t == 1.0
    summary = json.loads((DEFAULT_DRAFTER / "training_summary.json").read_text())
    assert summary["calibration"] == cal

    target = AutoModelForCausalLM.from_pretrained(resolve_model(None), dtype=torch.float32).eval()
    drafter = DSparkDrafter.from_pretrained(DEFAULT_DRAFTER, target_embed=target.get_input_embeddings().weight,
                                            target_lm_head=target.get_output_embeddings().weight,
                                            dtype=torch.float32)
    temps = torch.tensor(cal["temperatures"], dtype=torch.float64)
    torch.testing.assert_close(drafter.conf_temperatures, temps, rtol=0, atol=0)
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(4, drafter.gamma, drafter.config.hidden_size, generator=gen)
    anchors = torch.randint(0, drafter.config.vocab_size, (4,), generator=gen)
    with torch.no_grad():
        scaled = drafter.decode(h, anchors).confidence.double()
        drafter.conf_temperatures = None
        raw = drafter.decode(h, anchors).confidence.double()
    torch.testing.assert_close(torch.logit(scaled), torch.logit(raw) / temps, rtol=1e-4, atol=1e-4)
