"""Where the daemon served a response's choices: the `serving_info` a client asks for with
`"return_serving_info": true` (docs/api.md#serving-info).

The HTTP API's contract with its clients, like ipc/api_codes.py: the daemon writes it
(daemon/response_streamer.py), `ascendra bench` reads it into its records (bench/loadgen/loadgen.py)
so that a live run's records say what a simulated run's do -- without importing the
daemon's internals.
"""
from __future__ import annotations

import msgspec


class ChoiceServing(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One choice (one engine request): `instances` that held it, in order (empty: it
    never reached one -- e.g. dropped while it waited at the controller); `offloaded`:
    moved off an LP instance before its prefill started; `role`: the role of the instance
    that gave its first token, in a layout whose roles change online (`<n>A`);
    `queue_delay`: seconds from its arrival to the start of its prefill (its wait in a
    queue), absent when its prefill never started."""
    index: int
    instances: list[int]
    offloaded: bool = False
    role: str | None = None
    queue_delay: float | None = None


class ServingInfo(msgspec.Struct):
    """Every choice that reached an answer, by `index` (the response's choice index)."""
    choices: list[ChoiceServing]
