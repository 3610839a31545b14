"""Where a request goes. Pure: the caller passes in what it knows of each instance.

Ascendra (paper §4, §6.1): a new request goes to the HP whose ticket is open, else
round-robin over the LP pool; an offloaded one goes to the HP with the shortest
waiting queue. Baselines with identical instances use `least_loaded`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


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


class Tickets(Protocol):
    """The part of `admission.TicketBook` routing uses."""

    def take(self) -> int | None: ...


def route_new(ticket_book: Tickets, lp_ids: Sequence[int], last_lp: int = -1
              ) -> tuple[int | None, bool]:
    """Where a new request goes: (instance id, whether it used an HP ticket).

    An open HP ticket wins (and closes); otherwise round-robin over the LP pool after
    `last_lp`. (None, False) when there is neither.
    """
    hp = ticket_book.take()
    if hp is not None:
        return hp, True
    return round_robin(lp_ids, last_lp), False


def route_offload(hp_waiting: Sequence[tuple[int, int]]) -> int | None:
    """The HP for an offloaded request: the shortest waiting queue, ties to the lowest id.

    `hp_waiting` is (HP id, requests waiting there) for every HP that can take work.
    """
    if not hp_waiting:
        return None
    return min(hp_waiting, key=lambda item: (item[1], item[0]))[0]
