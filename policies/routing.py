"""Where a request goes, pure: the rules `policies.router.Router` applies. The caller
passes in what it knows of each instance.

A new request goes to the pool by round-robin or to the least loaded (`Routing`); an
offloaded one goes to the HP with the shortest waiting queue (paper §4).
"""
from __future__ import annotations

import enum
from collections.abc import Sequence


class Routing(str, enum.Enum):
    """How a new request picks among peer instances."""

    ROUND_ROBIN = "round_robin"    # in turn, whatever their load
    LEAST_LOADED = "least_loaded"  # the fewest requests in flight; ties in turn


def least_loaded(loads: Sequence[tuple[int, int]], last: int = -1) -> int | None:
    """The instance with the fewest requests in flight; ties go round-robin after `last`.

    `loads` is (instance id, requests in flight) for every instance that can take work.
    """
    if not loads:
        return None
    fewest = min(load for _, load in loads)
    tied = sorted(i for i, load in loads if load == fewest)
    return next((i for i in tied if i > last), tied[0])


def round_robin(instance_ids: Sequence[int], last: int = -1) -> int | None:
    """The next instance id after `last`, wrapping around."""
    ids = sorted(instance_ids)
    if not ids:
        return None
    return next((i for i in ids if i > last), ids[0])


def route_offload(hp_waiting: Sequence[tuple[int, int]]) -> int | None:
    """The HP for an offloaded request: the shortest waiting queue, ties to the lowest id.

    `hp_waiting` is (HP id, requests waiting there) for every HP that can take work.
    """
    if not hp_waiting:
        return None
    return min(hp_waiting, key=lambda item: (item[1], item[0]))[0]
