"""How long an LP step may take without costing a running request its TBT target.

Goodput (paper §8.2) counts a request whose *mean* time between tokens is within its TBT
SLO. A request that has produced g tokens since its first one at t0 keeps its mean within
`slo` after one more step ending at `now + step` while

    (now + step − t0) / g  <=  slo      i.e.  step <= slo·g − (now − t0).

Its slack grows whenever steps run faster than the SLO (decode-only steps usually do),
and the LP may spend it on longer prefill steps when prompts wait. A step of one `slo`
is always allowed: that is the per-step rule (Sarathi-Serve sizes its chunks to it) and
never raises a mean that is already within the SLO above it.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol


class Decoding(Protocol):
    """The part of a running request the budget reads."""

    @property
    def tbt_slo(self) -> float: ...
    @property
    def first_token_time(self) -> float | None: ...
    @property
    def num_output_tokens(self) -> int: ...


def tbt_slack(request: Decoding, now: float) -> float:
    """Seconds the next step may take with this request's mean TBT still within its SLO."""
    slo = request.tbt_slo
    if not math.isfinite(slo):
        return math.inf
    if request.first_token_time is None or request.num_output_tokens < 1:
        return slo
    gaps_after_step = request.num_output_tokens
    return max(slo, slo * gaps_after_step - (now - request.first_token_time))


def step_time_allowed(running: Iterable[Decoding], now: float) -> float:
    """The longest next step every running request can afford (`inf` if none has a TBT SLO)."""
    return min((tbt_slack(request, now) for request in running), default=math.inf)
