"""Capacity: the highest arrival rate (QPS) at which goodput stays >= a target (90%).

Goodput falls as load rises, so the search doubles the rate until goodput drops
below the target, then bisects the bracket to `tolerance` (relative).
"""
from __future__ import annotations

from collections.abc import Callable

from bench.records import RunResult


def find_capacity(run_at: Callable[[float], RunResult], *, target: float = 90.0,
                  start_qps: float = 1.0, tolerance: float = 0.03, max_runs: int = 16,
                  ) -> tuple[float, list[dict]]:
    """(capacity QPS, the points tried as {qps, goodput_pct, ...}). 0 if even `start_qps` fails."""
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
            return lo, points
    while hi - lo > tolerance * hi and len(points) < max_runs:
        mid = (lo + hi) / 2
        if good(mid):
            lo = mid
        else:
            hi = mid
    return lo, sorted(points, key=lambda p: p["qps"])
