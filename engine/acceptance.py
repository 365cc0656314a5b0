"""Acceptance tracking: how often each draft position was accepted, against what the confidences predicted.

The drafter's confidence head is calibrated offline; online, a sequence's acceptance per position corrects it, so a
head that is over-confident on hard content still gets short verifies. Pure Python over plain numbers.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AcceptanceTracker:
    """Observed acceptance per block position, per sequence and overall, against what the confidences predicted.

    For position k the correction is ratio_k = observed_k / predicted_k, both EMAs over the steps in which position
    k was reached (its prefix accepted and k verified). A sequence's own ratio starts at the global one and moves to
    its own as its observations outweigh `prior_weight`."""

    gamma: int
    decay: float = 0.9  # per sequence: about its last 10 steps
    global_decay: float = 0.99  # over all sequences: about the last 100 observations
    prior_weight: float = 4.0

    def __post_init__(self) -> None:
        self.global_obs = [0.0] * self.gamma
        self.global_pred = [0.0] * self.gamma
        self.per_seq: dict = {}  # key -> (observed, predicted) EMAs per position

    def record(self, key, confidences: list[float], verified: int, accepted: int) -> None:
        """A draft step of `key` verified `verified` drafts of which the first `accepted` were accepted. Called for
        every drafted step, also when nothing was verified: a sequence's evidence fades step by step, so a position
        it stopped verifying drifts back to the global estimate and gets tried again."""
        obs, pred = self.per_seq.setdefault(key, ([0.0] * self.gamma, [0.0] * self.gamma))
        reached = min(verified, accepted + 1)  # the accepted positions and the first rejection
        d = self.global_decay
        for k in range(self.gamma):
            obs[k] *= self.decay
            pred[k] *= self.decay
            if k < reached:
                hit = 1.0 if k < accepted else 0.0
                obs[k] += hit
                pred[k] += confidences[k]
                self.global_obs[k] = d * self.global_obs[k] + hit
                self.global_pred[k] = d * self.global_pred[k] + confidences[k]

    def ratio(self, key, k: int) -> float:
        g = (self.global_obs[k] + 1.0) / (self.global_pred[k] + 1.0)  # +1 on both: a neutral prior
        obs, pred = self.per_seq.get(key, (None, None))
        if obs is None:
            return g
        return (obs[k] + self.prior_weight * g) / (pred[k] + self.prior_weight)

    def corrected(self, key, confidences: list[float]) -> list[float]:
        return [min(1.0, max(0.0, c * self.ratio(key, k))) for k, c in enumerate(confidences)]

    def forget(self, key) -> None:
        self.per_seq.pop(key, None)


def survival(confidences: list[float]) -> list[float]:
    """Prefix survival a_j = prod_{i<=j} c_i: the chance that drafts 1..j are all accepted."""
    out, a = [], 1.0
    for c in confidences:
        a *= c
        out.append(a)
    return out
