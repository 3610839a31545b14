"""Open-loop arrival times: Poisson, or gamma-distributed gaps for bursty traffic.

Same meaning as `vllm bench serve --burstiness`: the gaps between arrivals are drawn
from a gamma distribution with shape = burstiness and mean 1/rate. Burstiness 1 is a
Poisson process (exponential gaps, coefficient of variation 1); below 1 arrivals come
in bursts (CV = 1/sqrt(burstiness), so 0.25 gives CV 2); above 1 they are more even.
A rate of `inf` sends everything at once.

`onoff_offsets` is a two-state Markov-modulated Poisson process (`OnOff`): ON and OFF
periods of exponential length, Poisson arrivals at a multiple of the rate in each, the
OFF multiple set so that the long-run mean rate is the rate asked for.
"""
from __future__ import annotations

import math

import msgspec
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


class OnOff(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """ON periods (mean `on_mean_s`) at `on_factor` x the rate, OFF periods (mean
    `off_mean_s`) at `off_factor` x the rate; the defaults: ON 10 s at 3x, OFF 30 s at 1/3x."""
    on_mean_s: float = 10.0
    off_mean_s: float = 30.0
    on_factor: float = 3.0

    @property
    def on_share(self) -> float:
        """The long-run share of time spent ON."""
        return self.on_mean_s / (self.on_mean_s + self.off_mean_s)

    @property
    def off_factor(self) -> float:
        """The OFF multiple that keeps the long-run mean rate at 1x."""
        return (1.0 - self.on_share * self.on_factor) / (1.0 - self.on_share)

    def check(self) -> None:
        if not (self.on_mean_s > 0 and self.off_mean_s > 0
                and math.isfinite(self.on_mean_s + self.off_mean_s)):
            raise ValueError(f"on/off: on_mean_s and off_mean_s must be > 0, got "
                             f"{self.on_mean_s} and {self.off_mean_s}")
        if not 1.0 <= self.on_factor <= 1.0 / self.on_share:
            raise ValueError(f"on/off: on_factor must be 1..{1.0 / self.on_share:g} (ON "
                             f"{self.on_share:.0%} of the time), got {self.on_factor}")


#: The on/off process of the `onoff` workload (ON 10 s at 3x, OFF 30 s at 1/3x).
DEFAULT_ONOFF = OnOff()


def onoff_offsets(rate: float, onoff: OnOff = DEFAULT_ONOFF, seed: int = 0, *,
                  n: int | None = None, duration: float | None = None) -> np.ndarray:
    """Arrival times (the first at 0) of `n` requests, or of all within `duration` seconds.

    The first period is ON with probability `on_share` (the process starts in its
    long-run state); within a period the arrivals are uniform, their count Poisson.
    """
    onoff.check()
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"an on/off workload needs a finite rate > 0, got {rate}")
    if (n is None) == (duration is None):
        raise ValueError("give exactly one of n and duration")
    if n is not None and n <= 0:
        return np.zeros(0)
    rng = np.random.default_rng([seed, 5])
    on = bool(rng.random() < onoff.on_share)
    chunks, count, start, first = [], 0, 0.0, None
    while True:
        length = rng.exponential(onoff.on_mean_s if on else onoff.off_mean_s)
        factor = onoff.on_factor if on else onoff.off_factor
        k = int(rng.poisson(rate * factor * length))
        if k:
            chunks.append(start + np.sort(rng.uniform(0.0, length, k)))
            count += k
            first = chunks[0][0] if first is None else first
        start, on = start + length, not on
        if (n is not None and count >= n) or (
                duration is not None and first is not None and start - first >= duration):
            break
    times = np.concatenate(chunks) - first
    return times[:n] if n is not None else times[times < duration]
