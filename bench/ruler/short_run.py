"""When a capacity is a first look, not a steady state -- and saying so.

A short run (few measured requests) starts empty and never builds the queues a long one
does, so it holds more load than the ruler's steady state would: `plan --measured 200`
once reported 201 % of the all-served ceiling with no word of doubt. Two checks, each a
warning on the result's line and `steady_state: false` in the JSON:

* **too short**: fewer than `STEADY_MIN_MEASURED` measured requests per point (the
  ruler's own runs measure 4,500; `--quick` runs 900);
* **above a hard bound**: a capacity above the bound for its goodput target (the most QPS
  the hardware sustains serving only the cheapest `target` % of the requests: no
  scheduler passes it), or a fair capacity above the fair ceiling. Above the all-served
  ceiling is possible -- a 90 % target may leave out the costliest 10 % -- and is not
  flagged.
"""
from __future__ import annotations

#: Fewer measured requests per point than this, and a capacity is not a steady state.
STEADY_MIN_MEASURED = 1500


def too_short(measured: int) -> str | None:
    """The warning for a run of `measured` requests per point, or None."""
    if measured >= STEADY_MIN_MEASURED:
        return None
    return (f"short run: {measured} measured requests per point (steady state needs >= "
            f"{STEADY_MIN_MEASURED}; the ruler uses 4500), so capacities read high")


def above_bound(qps: float, bound: float, what: str) -> str | None:
    """The warning for a capacity `qps` above the hard `bound` (named by `what`), or None."""
    if qps <= bound * 1.0001:
        return None
    return (f"{qps:.2f} QPS is above the {what} ({bound:.2f} QPS), which no scheduler can "
            "pass: the run is too short for steady state")
