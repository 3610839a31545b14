"""Which waiting request an HP's ticket takes (the global queue; daemon/core/waiting_room.py).

An HP with room asks for one new request (a ticket). Giving it the head of the queue is
right when prompts cost the same everywhere; with prefix caching they do not. A later
turn of a conversation whose history an LP holds costs the HP its whole prompt but that
LP only the new part, so sending it to the HP wastes most of the HP's step -- while a
request whose prefix the HP holds (a conversation it served before), or one cached
nowhere (a first turn), costs the HP no more than an LP. The ticket takes, among the
first `lookahead` in the plan's order, the request the HP would add least to: its
seconds there less its seconds on the cheapest LP; the earliest on ties, so without any
cached prefix it is the head, as before. Pure.
"""
from __future__ import annotations

from collections.abc import Sequence

from policies.global_queue import Waiting

#: How far down the plan's order a ticket looks: far enough to find a cheap request in a
#: busy queue, near enough that every one it may take is about due.
TICKET_LOOKAHEAD = 32


def ticket_pick(order: Sequence[Waiting], hp_id: int, lookahead: int = TICKET_LOOKAHEAD) -> int:
    """Index in `order` of the request HP `hp_id`'s ticket takes (`order` not empty)."""
    best, best_extra = 0, None
    for i, w in enumerate(order[:lookahead]):
        extra = w.seconds_on(hp_id, w.hp_cost) - w.cost if w.cost_on else 0.0
        if best_extra is None or extra < best_extra:
            best, best_extra = i, extra
    return best
