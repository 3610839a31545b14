"""What the policies read of a request: two views, one for waiting and one for running.

The engine's `Request` has both; tests pass small fakes. Policies never change a request.
"""
from __future__ import annotations

from typing import Protocol


class WaitingRequest(Protocol):
    """A request waiting for (the rest of) its prefill."""

    @property
    def arrival_time(self) -> float: ...
    @property
    def deadline(self) -> float: ...           # arrival + TTFT SLO (absolute)
    @property
    def priority(self) -> int: ...             # higher class first
    @property
    def num_computed_tokens(self) -> int: ...  # prompt tokens already in the KV cache
    @property
    def num_uncomputed_tokens(self) -> int: ...
    @property
    def prefill_started(self) -> bool: ...     # or pinned: it may no longer move or drop
    @property
    def block_table(self) -> list[int]: ...


class Sampling(Protocol):
    @property
    def max_tokens(self) -> int: ...


class RunningRequest(Protocol):
    """A request holding KV blocks (prefilling or decoding)."""

    @property
    def num_tokens(self) -> int: ...
    @property
    def num_output_tokens(self) -> int: ...
    @property
    def block_table(self) -> list[int]: ...
    @property
    def sampling(self) -> Sampling: ...
    @property
    def tbt_slo(self) -> float: ...
    @property
    def first_token_time(self) -> float | None: ...
