"""A request's latency targets from HTTP headers: `x-llm-d-slo-ttft-ms` and
`x-llm-d-slo-tpot-ms` (their deprecated aliases `x-slo-ttft-ms`, `x-slo-tpot-ms` too).

llm-d's router (the Gateway API Inference Extension's endpoint picker) reads these
headers for its SLO-aware plugins, so a client behind that gateway states its targets
once and both the gateway and Ascendra see them. The current name wins when a request
carries both (the router's rule, `pkg/epp/metadata/consts.go`). They set what the body fields
`ttft_slo` and `tbt_slo` set (TPOT, time per output token, is our TBT), in milliseconds
where the body says seconds. Precedence: the body field when given, else the header,
else the server's default ([slo]). Limits: the body's -- more than 0, at most a day; a
header that is not such a number (empty, not a decimal, inf, nan, 0, negative, past a
day, or sent twice with different values) is the client's 400, naming the header.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping

import msgspec

from daemon.header_aliases import first_named

TTFT_HEADER = "x-llm-d-slo-ttft-ms"
TPOT_HEADER = "x-llm-d-slo-tpot-ms"
#: Each target's names, the current one first (the one that wins), then the old alias.
TTFT_HEADERS = (TTFT_HEADER, "x-slo-ttft-ms")
TPOT_HEADERS = (TPOT_HEADER, "x-slo-tpot-ms")
#: The longest target a header may set, ms (the body fields' limit, a day).
MAX_SLO_MS = 86_400_000.0
#: A plain decimal: digits, an optional fraction (no sign, exponent, hex or spaces inside).
_DECIMAL = re.compile(r"\d+(\.\d+)?|\.\d+")


class BadSloHeader(ValueError):
    """A malformed SLO header; `param` names it (the 400's `param`)."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"{name}: {why}")
        self.param = name


def header_slo(headers, names: tuple[str, ...] | str) -> float | None:
    """The target the first of `names` the request carries sets, in seconds; None if
    absent. Raises BadSloHeader on a malformed value. `headers`: a multidict (aiohttp's)
    or a plain mapping."""
    name, values = first_named(headers, (names,) if isinstance(names, str) else names)
    if not values:
        return None
    if len(set(values)) > 1:
        raise BadSloHeader(name, f"sent {len(values)} times with different values")
    text = values[0].strip()
    if not _DECIMAL.fullmatch(text):
        raise BadSloHeader(name, f"{values[0]!r} is not a number of milliseconds")
    ms = float(text)
    if not (0 < ms <= MAX_SLO_MS and math.isfinite(ms)):
        raise BadSloHeader(name, f"{text} ms is out of range (more than 0, at most "
                                 f"{MAX_SLO_MS:.0f} ms)")
    return ms / 1000.0


def with_header_slos(body, headers: Mapping) -> object:
    """`body` (a request struct with `ttft_slo`/`tbt_slo`) with the headers' targets filled
    in where the body names none."""
    ttft, tbt = header_slo(headers, TTFT_HEADERS), header_slo(headers, TPOT_HEADERS)
    changes = {}
    if body.ttft_slo is None and ttft is not None:
        changes["ttft_slo"] = ttft
    if body.tbt_slo is None and tbt is not None:
        changes["tbt_slo"] = tbt
    return msgspec.structs.replace(body, **changes) if changes else body
