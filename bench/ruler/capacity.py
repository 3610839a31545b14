"""Capacity: the highest arrival rate (QPS) at which a layout holds its goodput target.

`find_capacity(holds, ...)` searches any pass/fail judge of a rate: it walks up from
`start_qps` in steps of `growth` while the rate holds (or down while it fails) until it
brackets the edge, then bisects the bracket [highest holding, lowest failing] until it
is narrower than `tolerance` x its top (`bisect_edge`, which also takes a bracket found
otherwise). The capacity is the highest rate that held.

With the steady-state judge (bench/ruler/steady_state.py) a rate holds when the measured
requests reach the target overall and in every window; a run that has already missed
too many measured requests to pass stops early (it fails whatever comes next).
"""
from __future__ import annotations

from collections.abc import Callable

#: The capacity definition (DESIGN.md §2): goodput >= 90 %.
CAPACITY_TARGET = 90.0


def find_capacity(holds: Callable[[float], bool], *, start_qps: float = 1.0,
                  tolerance: float = 0.03, max_runs: int = 16, growth: float = 2.0,
                  ) -> float:
    """The highest rate tried that held (0 if none did); the lowest failing rate tried
    lies within `tolerance` above it unless `max_runs` ran out."""
    if not (start_qps > 0 and tolerance > 0 and max_runs >= 1 and growth > 1):
        raise ValueError(f"need start_qps > 0, tolerance > 0, max_runs >= 1 and growth > 1; "
                         f"got {start_qps}, {tolerance}, {max_runs}, {growth}")
    runs = 0

    def judge(qps: float) -> bool:
        nonlocal runs
        runs += 1
        return holds(qps)

    lo, hi = 0.0, None
    qps = start_qps
    if judge(qps):
        lo = qps
        while hi is None and runs < max_runs:
            qps *= growth
            if judge(qps):
                lo = qps
            else:
                hi = qps
    else:
        hi = qps
        while lo == 0.0 and runs < max_runs and hi > start_qps / 64:
            qps /= growth
            if judge(qps):
                lo = qps
            else:
                hi = qps
    if hi is None:
        return lo
    return bisect_edge(holds, lo, hi, tolerance=tolerance, max_runs=max_runs - runs)


def bisect_edge(holds: Callable[[float], bool], lo: float, hi: float, *,
                tolerance: float = 0.03, max_runs: int = 16) -> float:
    """The edge inside a bracket (`lo` held, `hi` failed), bisected until it is narrower
    than `tolerance` x its top or `max_runs` ran: the highest rate that held."""
    runs = 0
    while hi - lo > tolerance * hi and runs < max_runs:
        runs += 1
        mid = (lo + hi) / 2
        if holds(mid):
            lo = mid
        else:
            hi = mid
    return lo
