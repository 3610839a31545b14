"""Open-loop arrival times: Poisson, or gamma-distributed gaps for bursty traffic.

Same meaning as `vllm bench serve --burstiness`: the gaps between arrivals are drawn
from a gamma distribution with shape = burstiness and mean 1/rate. Burstiness 1 is a
Poisson process (exponential gaps, coefficient of variation 1); below 1 arrivals come
in bursts (CV = 1/sqrt(burstiness), so 0.25 gives CV 2); above 1 they are more even.
A rate of `inf` sends everything at once.
"""
from __future__ import annotations

import math

import numpy as np


def _check(rate: float, burstiness: float) -> None:
    if not rate > 0:
        raise ValueError(f"request rate must be > 0 (or inf), got {rate}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness must be a positive number, got {burstiness}")


def gaps(n: int, rate: float, burstiness: float = 1.0,
         rng: np.random.Generator | None = None) -> np.ndarray:
    """`n` gaps (seconds) between consecutive arrivals; mean 1/rate."""
    _check(rate, burstiness)
    if math.isinf(rate):
        return np.zeros(n)
    rng = rng if rng is not None else np.random.default_rng(0)
    return rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)


def arrival_offsets(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Arrival times (seconds from the start) of `n` requests; the first arrives at 0."""
    if n <= 0:
        return np.zeros(0)
    between = gaps(n - 1, rate, burstiness, np.random.default_rng(seed))
    return np.concatenate(([0.0], np.cumsum(between)))


def arrivals_within(duration: float, rate: float, burstiness: float = 1.0,
                    seed: int = 0) -> np.ndarray:
    """All arrival times in [0, duration) of one seeded stream (the first at 0).

    The draws are the same as `arrival_offsets` with the same seed, so a
    `--duration` run is a prefix of a `--num-requests` run.
    """
    _check(rate, burstiness)
    if math.isinf(rate):
        raise ValueError("a duration needs a finite request rate")
    rng = np.random.default_rng(seed)
    times, now = [0.0], 0.0
    block = max(16, int(rate * duration * 1.2))
    while True:
        for gap in gaps(block, rate, burstiness, rng):
            now += gap
            if now >= duration:
                return np.asarray(times)
            times.append(now)
