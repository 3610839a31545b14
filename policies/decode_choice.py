"""Which decode instance takes a prefilled request in a P/D layout (DistServe). Pure.

A decode instance's limit is its KV memory: every request it holds keeps its whole
context there until it ends. So the request goes where the KV would be least full
after taking it -- counted by the controller from the tokens of the requests each one
holds, exact without waiting for a report -- among the instances it fits in; ties go
to the one holding fewer requests (a smaller decode batch is a shorter step), then the
lower id. When it fits nowhere, the least full still takes it (it recomputes or
preempts there: slower, never lost).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class DecodeView(NamedTuple):
    instance_id: int
    kv_tokens: int            # tokens of context the requests it holds keep in its KV
    kv_capacity_tokens: int   # its KV blocks x block size
    num_held: int             # requests it holds


def choose_decode(candidates: Sequence[DecodeView], num_tokens: int) -> int | None:
    """The decode instance for a request with `num_tokens` of context; None: no candidate."""
    if not candidates:
        return None

    def fullness(view: DecodeView) -> float:
        return (view.kv_tokens + num_tokens) / max(view.kv_capacity_tokens, 1)

    fitting = [v for v in candidates if fullness(v) <= 1.0] or list(candidates)
    return min(fitting, key=lambda v: (fullness(v), v.num_held, v.instance_id)).instance_id
