"""Request traces for the fleet simulator: arrival times, prompt tokens, output tokens.

A trace hands out the arrivals of a time window, thinned to a `fraction` of the traffic (the share of the fleet the
simulator models one replica at a time). A synthetic trace is a Poisson process, so it draws the thinned process
directly (rate x fraction), which has the same distribution as thinning the full one and costs only what is kept.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

DAY_S = 86400.0


@dataclass(frozen=True)
class LengthDist:
    """Token counts from a lognormal (median, sigma of the log), rounded and clipped to [lo, hi]."""

    median: float
    sigma: float
    lo: int = 1
    hi: int = 8192

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = self.median * np.exp(self.sigma * rng.standard_normal(n))
        return np.clip(np.rint(x), self.lo, self.hi).astype(np.int64)

    def mean(self) -> float:
        return self.median * float(np.exp(self.sigma**2 / 2))  # before clipping


PROMPT = LengthDist(256, 0.8, 8, 4096)  # chat prompts with some long contexts (assumed)
OUTPUT = LengthDist(128, 0.7, 1, 2048)


def diurnal(peak: float = 3000.0, trough_frac: float = 0.05, period_s: float = DAY_S, peak_at_s: float | None = None,
            noise: float = 0.08, noise_corr_s: float = 900.0, seed: int = 0) -> Callable[[np.ndarray], np.ndarray]:
    """Requests/s over a day: a raised cosine between trough (at t = 0) and peak (at `peak_at_s`, default half a
    period), times slow log-normal noise (an AR(1) of correlation time `noise_corr_s`, on a one-minute grid)."""
    peak_at = period_s / 2 if peak_at_s is None else peak_at_s
    trough = trough_frac * peak
    step = 60.0
    n = int(np.ceil(period_s / step)) + 2
    rng = np.random.default_rng(seed)
    rho = float(np.exp(-step / noise_corr_s))
    eps = rng.standard_normal(n) * noise * np.sqrt(1 - rho**2)
    log_noise = np.empty(n)
    log_noise[0] = rng.standard_normal() * noise
    for i in range(1, n):
        log_noise[i] = rho * log_noise[i - 1] + eps[i]
    factor = np.exp(log_noise - noise**2 / 2)  # mean 1

    def rate(t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        base = trough + (peak - trough) * 0.5 * (1 - np.cos(2 * np.pi * (t - peak_at + period_s / 2) / period_s))
        return base * np.interp(t / step, np.arange(n), factor)

    return rate


def step_load(low: float, high: float, t_on: float, t_off: float) -> Callable[[np.ndarray], np.ndarray]:
    """Requests/s: `low`, then `high` during [t_on, t_off)."""

    def rate(t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        return np.where((t >= t_on) & (t < t_off), high, low).astype(float)

    return rate


class Trace:
    """Interface: `duration_s`, `rate(t)` (requests/s, for plots) and `arrivals(t0, t1, fraction, rng)` ->
    (times, prompt_tokens, output_tokens) of the window [t0, t1), sorted by time."""

    duration_s: float

    def rate(self, t):
        raise NotImplementedError

    def arrivals(self, t0: float, t1: float, fraction: float, rng: np.random.Generator):
        raise NotImplementedError


class SyntheticTrace(Trace):
    """A Poisson process of rate `rate_fn(t)` (piecewise constant over `bin_s`), lengths from `prompt`/`output`."""

    def __init__(self, rate_fn: Callable, duration_s: float, prompt: LengthDist = PROMPT,
                 output: LengthDist = OUTPUT, bin_s: float = 1.0):
        self.rate_fn, self.duration_s, self.prompt, self.output, self.bin_s = rate_fn, duration_s, prompt, output, bin_s

    def rate(self, t):
        return self.rate_fn(t)

    def arrivals(self, t0, t1, fraction, rng):
        t1 = min(t1, self.duration_s)
        if t1 <= t0:
            return np.empty(0), np.empty(0, np.int64), np.empty(0, np.int64)
        edges = np.arange(t0, t1, self.bin_s)
        widths = np.minimum(edges + self.bin_s, t1) - edges
        counts = rng.poisson(self.rate_fn(edges + widths / 2) * widths * fraction)
        n = int(counts.sum())
        times = np.repeat(edges, counts) + rng.random(n) * np.repeat(widths, counts)
        times.sort()
        return times, self.prompt.sample(rng, n), self.output.sample(rng, n)


class ArrayTrace(Trace):
    """An explicit list of requests (e.g. a recorded trace), thinned by a coin flip per request."""

    def __init__(self, times, prompts, outputs):
        order = np.argsort(times, kind="stable")
        self.times = np.asarray(times, float)[order]
        self.prompts = np.asarray(prompts, np.int64)[order]
        self.outputs = np.asarray(outputs, np.int64)[order]
        self.duration_s = float(self.times[-1]) if len(self.times) else 0.0

    def rate(self, t, window_s: float = 60.0):
        t = np.asarray(t, float)
        lo = np.searchsorted(self.times, t - window_s / 2)
        hi = np.searchsorted(self.times, t + window_s / 2)
        return (hi - lo) / window_s

    def arrivals(self, t0, t1, fraction, rng):
        i, j = np.searchsorted(self.times, [t0, t1])
        keep = slice(i, j) if fraction >= 1 else i + np.flatnonzero(rng.random(j - i) < fraction)
        return self.times[keep], self.prompts[keep], self.outputs[keep]
