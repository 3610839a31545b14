"""A request's queue TTL from llm-d's `x-llm-d-inference-ttl` header.

llm-d's router sets it (a Go duration such as `1500ms`, `2s`, `1m30s`) for how long the
request may wait in its flow-control queue; a client can set it too. Ascendra honours it
as a bound on the request's wait for its first token: a request still waiting past it
ends with 503 `ttl_expired` (the controller core's overdue check, daemon/core/
late_binding.py). A value of zero means no TTL, as a band's `0s` does in llm-d. Anything
else that is not a positive Go duration of at most a day (a bare number, a sign, an
unknown unit, the header twice with different values) is the client's 400, naming the
header.
"""
from __future__ import annotations

import re

from daemon.header_aliases import values_of
from daemon.slo_headers import MAX_SLO_MS, BadSloHeader
from ipc.tenancy import TTL_HEADER

#: Go's time.ParseDuration units, in seconds ("µs" and "μs" are Go's spellings of "us").
UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0,
         "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION = re.compile(rf"(?:{_PART.pattern})+")


def go_duration(text: str) -> float:
    """Seconds of a Go duration without a sign ("1500ms", "1m30s", "0"); ValueError else."""
    if text == "0":
        return 0.0
    if not _DURATION.fullmatch(text):
        raise ValueError(f"{text!r} is not a duration such as 1500ms, 2s or 1m30s")
    return sum(float(number) * UNITS[unit] for number, unit in _PART.findall(text))


def header_ttl(headers) -> float | None:
    """The request's queue TTL, seconds; None when absent or zero (no TTL). Raises
    BadSloHeader (a 400 naming the header) on a malformed value."""
    values = values_of(headers, TTL_HEADER)
    if not values:
        return None
    if len({v.strip() for v in values}) > 1:
        raise BadSloHeader(TTL_HEADER, f"sent {len(values)} times with different values")
    try:
        seconds = go_duration(values[0].strip())
    except ValueError as exc:
        raise BadSloHeader(TTL_HEADER, str(exc)) from None
    if seconds * 1000 > MAX_SLO_MS:
        raise BadSloHeader(TTL_HEADER, f"{values[0].strip()} is more than a day")
    return seconds or None
