"""The step-cost model: the seconds one engine step takes, as a function of its tokens and of the sequences drafted.

Its inverse SPS(B), steps per second at B tokens, is what Algorithm 1 of the DSpark paper weighs against the tokens
a longer verify is expected to add (engine/verify_length.py). Pure Python over plain numbers: no tensors, no model.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass


def isotonic(values: list[float]) -> list[float]:
    """The least-squares non-decreasing fit of `values` (pool adjacent violators)."""
    pools: list[list[float]] = []  # [sum, count] of each run of pooled values
    for v in values:
        pools.append([v, 1])
        while len(pools) > 1 and pools[-2][0] * pools[-1][1] > pools[-1][0] * pools[-2][1]:
            total, n = pools.pop()
            pools[-1][0] += total
            pools[-1][1] += n
    return [total / n for total, n in pools for _ in range(int(n))]


@dataclass
class Curve:
    """Seconds as a function of a size: a shape on a grid (piecewise linear, extrapolated linearly beyond it) times
    a speed factor, both kept current by measurements.

    The factor follows the machine: every measurement moves it by `alpha` of its relative error, so a machine that
    slows down (a shared CPU's speed swings within minutes) scales every point at once. The remaining error corrects
    the two nearest grid points, shared by their interpolation weights (so a step of 100 tokens does not drag the
    point at 64 towards its own, longer, time). Without the factor, the points seen often (1 token at concurrency 1)
    track the machine while the rest keep the speed of whenever they were last seen, and the curve's slope, which is
    what Algorithm 1 weighs, becomes a record of the machine's mood. Reads go through the least-squares
    non-decreasing fit of the points: more work never takes less time, and a noisy point below its left neighbour
    would make the next token look free."""

    grid: list[int]
    seconds: list[float]
    alpha: float = 0.1
    scale: float = 1.0

    def __post_init__(self) -> None:
        self.fitted = isotonic(self.seconds)

    @staticmethod
    def _interpolate(g: list[int], s: list[float], x: float) -> float:
        if x <= g[0]:
            return s[0]
        if x >= g[-1]:
            return s[-1] * x / g[-1]
        i = bisect.bisect_right(g, x) - 1
        w = (x - g[i]) / (g[i + 1] - g[i])
        return s[i] + w * (s[i + 1] - s[i])

    def at(self, x: float) -> float:
        return self.scale * self._interpolate(self.grid, self.fitted, x)

    def observe(self, x: float, seconds: float) -> None:
        g = self.grid
        shape = self._interpolate(g, self.seconds, x)  # the raw points, which converge to the data
        if shape > 0:
            self.scale *= 1.0 + self.alpha * (seconds / (self.scale * shape) - 1.0)
        error = (seconds / self.scale - shape) / 4  # the shape moves slower: most of a change is the machine's
        if x <= g[0]:
            points = [(0, 1.0)]
        elif x >= g[-1]:
            points, error = [(len(g) - 1, 1.0)], error * g[-1] / x
        else:
            i = bisect.bisect_right(g, x) - 1
            w = (x - g[i]) / (g[i + 1] - g[i])
            points = [(i, 1.0 - w), (i + 1, w)]
        for i, weight in points:
            self.seconds[i] += self.alpha * weight * error
        self.fitted = isotonic(self.seconds)


@dataclass
class StepCostModel:
    """The cost of one engine step: the packed forward as a function of its tokens B, plus the draft round as a
    function of the sequences drafted (independent of how many drafts are then verified). SPS(B) is its inverse.
    Both curves are seeded by a start-up sweep and follow the measured steps from then on."""

    forward: Curve
    draft: Curve | None = None

    def step_seconds(self, tokens: int, drafted_seqs: int = 0) -> float:
        extra = self.draft.at(drafted_seqs) if (drafted_seqs and self.draft is not None) else 0.0
        return self.forward.at(tokens) + extra

    def sps(self, tokens: int, drafted_seqs: int = 0) -> float:
        return 1.0 / self.step_seconds(tokens, drafted_seqs)

    def table(self) -> dict[int, float]:
        """SPS(B) at the grid points, for metrics."""
        return {b: 1.0 / self.forward.at(b) for b in self.forward.grid}
