"""Capacity: the highest arrival rate (QPS) at which goodput stays >= a target (90%).

Goodput falls as load rises, so the search doubles the rate from `start_qps` until
goodput drops below the target, then bisects the bracket [highest passing, lowest
failing] until it is narrower than `tolerance` x its top. When `start_qps` already
fails, the bracket is [0, start_qps]: the search goes on below it.
"""
from __future__ import annotations

from collections.abc import Callable

from bench.records import RunResult


def find_capacity(run_at: Callable[[float], RunResult], *, target: float = 90.0,
                  start_qps: float = 1.0, tolerance: float = 0.03, max_runs: int = 16,
                  ) -> tuple[float, list[dict]]:
    """(capacity QPS, the points tried as {qps, goodput_pct, ...} in QPS order).

    The capacity is the highest rate tried that held the target (0 if none did); the
    lowest failing rate tried lies within `tolerance` above it unless `max_runs` ran out.
    """
    if not (start_qps > 0 and tolerance > 0 and max_runs >= 1):
        raise ValueError(f"need start_qps > 0, tolerance > 0 and max_runs >= 1; got "
                         f"{start_qps}, {tolerance}, {max_runs}")
    points: list[dict] = []

    def good(qps: float) -> bool:
        result = run_at(qps)
        points.append({"qps": qps, "goodput_pct": result.goodput_pct,
                       "goodput_rps": result.goodput_rps, "throughput_rps": result.throughput_rps,
                       "p99_ttft_s": result.ttft_s.p99, "p99_tbt_s": result.p99_tbt_s,
                       "offloaded": result.offloaded, "dropped": result.dropped})
        return result.goodput_pct >= target

    lo, hi = 0.0, start_qps
    while good(hi):
        lo, hi = hi, hi * 2
        if len(points) >= max_runs:
            return lo, sorted(points, key=lambda p: p["qps"])
    while hi - lo > tolerance * hi and len(points) < max_runs:
        mid = (lo + hi) / 2
        if good(mid):
            lo = mid
        else:
            hi = mid
    return lo, sorted(points, key=lambda p: p["qps"])
