"""How long an LP step may take without costing a running request its TBT target.

Goodput (docs/design.md §2) counts a request whose *mean* time between tokens is within its TBT
SLO. A request that has produced g tokens since its first one at t0 keeps its mean within
`slo` after one more step ending at `now + step` while

    (now + step − t0) / g  <=  slo      i.e.  step <= slo·g − (now − t0).

Its slack grows whenever steps run faster than the SLO (decode-only steps usually do),
and the LP may spend it on longer prefill steps when prompts wait. A step of one `slo`
is always allowed: that is the per-step rule (Sarathi-Serve sizes its chunks to it) and
never raises a mean that is already within the SLO above it.

The one exception (`whole_prefill_pays`, on LPs and HPs): a prompt that meets its TTFT
only if its whole prefill runs in the next step gets that step, and the decodes beside
it wait one longer step.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

from policies.request_view import RunningRequest


def tbt_margin(request: RunningRequest, now: float) -> float:
    """Seconds the next step may take with this request's mean TBT still within its SLO."""
    slo = request.tbt_slo
    if not math.isfinite(slo):
        return math.inf
    if request.first_token_time is None or request.num_output_tokens < 1:
        return slo
    gaps_after_step = request.num_output_tokens
    return max(slo, slo * gaps_after_step - (now - request.first_token_time))


def step_time_allowed(running: Iterable[RunningRequest], now: float) -> float:
    """The longest next step every running request can afford (`inf` if none has a TBT
    SLO): `min(tbt_margin)`, written out because it runs over every decode of every step."""
    allowed = math.inf
    for request in running:
        slo = request.tbt_slo
        if slo >= allowed:
            continue  # its slack is at least its SLO: it cannot lower the minimum
        first = request.first_token_time
        if first is not None and (gaps := request.num_output_tokens) >= 1:
            slack = slo * gaps - (now - first)
            if not slack > slo:  # max(slo, slack), as `max` picks
                slack = slo
        else:
            slack = slo
        if slack < allowed:  # min(allowed, slack), as `min` picks
            allowed = slack
    return allowed


#: Shortest prefill per step `whole_prefill_pays` reckons with (a budget of nothing would
#: otherwise take for ever).
MIN_STEP_PREFILL_SECONDS = 1e-3


def whole_prefill_pays(now: float, deadline: float, decode_seconds: float,
                       whole_seconds: float, chunk_seconds: float) -> bool:
    """Whether a prompt meets its TTFT `deadline` only if its whole prefill
    (`whole_seconds`) runs in the next step, beside decodes taking `decode_seconds`:
    whole, it finishes in time; in steps of `chunk_seconds` of prefill each (what the
    TBT budget allows) beside the same decodes, it would not. A prompt lost either way
    spends no one's TBT.

    Why an instance may do this: a long prompt with a tight target (on an HP, where
    requests go because their TTFT is at risk: mixed-slo's interactive class, 0.5 s; on
    an LP, a 6,000-token prompt against 1 s) cannot make it in TBT-sized chunks behind a
    busy step, while one step of a few hundred milliseconds costs the decodes beside it
    little of their *mean* TBT, which is what goodput counts (docs/fairness.md has the
    measurements)."""
    if now + decode_seconds + whole_seconds > deadline:
        return False
    per_step = max(min(chunk_seconds, whole_seconds), MIN_STEP_PREFILL_SECONDS)
    steps = math.ceil(whole_seconds / per_step)
    return now + steps * (per_step + decode_seconds) > deadline
