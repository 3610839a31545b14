"""Messages between the engine and its callers.

msgspec structs (array-like: compact on the wire); issue #3 adds the
controller <-> instance tagged union around them.
"""
from __future__ import annotations

import msgspec


class TokenOutput(msgspec.Struct, array_like=True, frozen=True):
    """One new token of one request from one engine step; `finish_reason` set on its last."""

    request_id: str
    token_id: int
    finish_reason: str | None = None
