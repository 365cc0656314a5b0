"""The step-cost model: the seconds one engine step takes, as a function of its tokens, of the cached context its
attention reads (the KV of every sequence in it) and of the sequences drafted.

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
    what Algorithm 1 weighs, becomes a record of the machine's mood. The first point (a 1-token step) stays as the
    sweep timed it and the factor alone follows it: were both to learn from it, the split between them would be
    free, and at one stream, where nearly every step is that point, it wandered (the factor up by orders of
    magnitude, the point down towards zero) until the other points, scaled up with the factor, made every verify
    look far too dear and none ran, so none corrected them. Reads go through the least-squares
    non-decreasing fit of the points: more work never takes less time, and a noisy point below its left neighbour
    would make the next token look free.

    A step also reads the cached K/V of its sequences: `kv_coef` seconds (before the speed factor) per cached token,
    the least-squares slope of the measured seconds against the KV read, over about the last 10 / alpha steps,
    within classes of steps of the same size (their tokens; powers of two above 16, where the token curve's
    difference within the class is taken out), each about its own mean. The slope reads the measurements, not the
    curve's own prediction: fitted to what the curve left over, it fed back through the curve's own state (a larger
    slope pulled the 1-token point or the factor down, which raised the residuals of the decodes, whose KV grows
    step by step, which raised the slope) until the curve predicted negative seconds. Pooled over all sizes, it
    confounded the KV with the size (prefills read none, decodes all of it). It is never negative, and stays 0
    while the KV read does not vary within a class (a curve fed no KV is the token curve alone); alpha 0 keeps the
    whole curve fixed."""

    grid: list[int]
    seconds: list[float]
    alpha: float = 0.1
    scale: float = 1.0
    kv_coef: float = 0.0

    def __post_init__(self) -> None:
        self.fitted = isotonic(self.seconds)
        # per class of step size (its first size): faded sums of weight, kv, seconds, kv^2 and kv * seconds
        self.kv_sums: dict[int, list[float]] = {}

    @staticmethod
    def _interpolate(g: list[int], s: list[float], x: float) -> float:
        if x <= g[0]:
            return s[0]
        if x >= g[-1]:
            return s[-1] * x / g[-1]
        i = bisect.bisect_right(g, x) - 1
        w = (x - g[i]) / (g[i + 1] - g[i])
        return s[i] + w * (s[i + 1] - s[i])

    def at(self, x: float, kv: float = 0.0) -> float:
        return self.scale * (self._interpolate(self.grid, self.fitted, x) + self.kv_coef * kv)

    def observe(self, x: float, seconds: float, kv: float = 0.0) -> None:
        g = self.grid
        tokens_shape = self._interpolate(g, self.seconds, x)  # the raw points, which converge to the data
        shape = tokens_shape + self.kv_coef * kv
        if shape > 0:
            self.scale *= 1.0 + self.alpha * (seconds / (self.scale * shape) - 1.0)
        # the KV slope's classes: exact sizes up to 16 tokens, powers of two above, where the step's seconds are
        # taken as at the class's first size (the token curve's difference, a small part of the step, taken out)
        first = int(x) if x <= 16 else 1 << (int(x).bit_length() - 1)
        self._fit_kv(first, kv, seconds - self.scale * (tokens_shape - self._interpolate(g, self.seconds, first)))
        # the shape moves slower: most of a change is the machine's
        error = (seconds / self.scale - tokens_shape - self.kv_coef * kv) / 4
        if x <= g[0]:
            points = [(0, 1.0)]
        elif x >= g[-1]:
            points, error = [(len(g) - 1, 1.0)], error * g[-1] / x
        else:
            i = bisect.bisect_right(g, x) - 1
            w = (x - g[i]) / (g[i + 1] - g[i])
            points = [(i, 1.0 - w), (i + 1, w)]
        for i, weight in points:
            if i:  # the first point is the anchor: the speed factor carries its changes (see the docstring)
                self.seconds[i] += self.alpha * weight * error
        self.fitted = isotonic(self.seconds)

    def _fit_kv(self, size_class: int, kv: float, seconds: float) -> None:
        fade, w = 1.0 - self.alpha / 10, self.alpha  # weights proportional to alpha: alpha 0 learns nothing
        sums = self.kv_sums.setdefault(size_class, [0.0] * 5)
        for other in self.kv_sums.values():
            for i in range(5):
                other[i] *= fade
        for i, value in enumerate((1.0, kv, seconds, kv * kv, kv * seconds)):
            sums[i] += w * value
        # each class about its own means: sum over classes of the centred cross- and square sums
        cov = var = total_sq = 0.0
        for n, sx, sy, sxx, sxy in self.kv_sums.values():
            if n > 0.0:
                cov += sxy - sx * sy / n
                var += sxx - sx * sx / n
                total_sq += sxx
        if var > 1e-2 * total_sq:  # the KV read varies enough within classes to tell its cost from the tokens'
            self.kv_coef = max(0.0, cov / var) / self.scale  # seconds per KV token now, in the curve's units


@dataclass
class StepCostModel:
    """The cost of one engine step: the packed forward as a function of its tokens B and of its KV read (the cached
    tokens of its sequences), plus the draft round as a function of the sequences drafted (independent of how many
    drafts are then verified). SPS(B) is its inverse. Both curves are seeded by a start-up sweep and follow the
    measured steps from then on."""

    forward: Curve
    draft: Curve | None = None

    def step_seconds(self, tokens: int, drafted_seqs: int = 0, kv_tokens: int = 0) -> float:
        extra = self.draft.at(drafted_seqs) if (drafted_seqs and self.draft is not None) else 0.0
        return self.forward.at(tokens, kv_tokens) + extra

    def sps(self, tokens: int, drafted_seqs: int = 0, kv_tokens: int = 0) -> float:
        return 1.0 / self.step_seconds(tokens, drafted_seqs, kv_tokens)

    def table(self) -> dict[int, float]:
        """SPS(B) at the grid points, for metrics."""
        return {b: 1.0 / self.forward.at(b) for b in self.forward.grid}
