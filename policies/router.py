"""Where requests go: the routing state the controller core keeps.

Pure bookkeeping around `policies.routing` (open tickets, the round-robin cursor);
the caller says which instances are ready and how loaded they are.

A new request takes an HP instance's open ticket (Ascendra layouts, docs/design.md §5.5), else
goes to the pool -- the LP instances of an Ascendra layout, every instance of a
baseline one -- by the configured `Routing` rule, the same for every layout. A request
an LP offloads goes to the HP instance with the shortest queue.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from policies.admission import TicketBook
from policies.routing import Routing, least_loaded, prefix_aware, round_robin, route_offload


class Router:
    def __init__(self, pool: Sequence[int], hp_ids: Sequence[int] = (),
                 routing: Routing = Routing.LEAST_LOADED) -> None:
        self.pool = sorted(pool)
        self.hp_ids = sorted(hp_ids)
        self.routing = Routing(routing)
        self.tickets = TicketBook()
        self._last = -1

    def route_new(self, ready: list[int], in_flight: Mapping[int, int],
                  cached: Mapping[int, int] | None = None) -> tuple[int | None, bool]:
        """(instance for a new request, whether it used an HP ticket). With no pool
        instance ready, any ready instance rather than a refusal. `cached`: prompt tokens
        of the request each instance is known to hold (prefix-aware routing)."""
        hp = self.tickets.take()
        if hp is not None:
            return hp, True
        candidates = [i for i in self.pool if i in ready] or list(ready)
        if self.routing is Routing.ROUND_ROBIN:
            choice = round_robin(candidates, self._last)
        elif self.routing is Routing.PREFIX_AWARE and cached:
            choice = prefix_aware([(i, in_flight.get(i, 0), cached.get(i, 0))
                                   for i in candidates], self._last)
        else:
            choice = least_loaded([(i, in_flight.get(i, 0)) for i in candidates], self._last)
        if choice is not None:
            self._last = choice
        return choice, False

    def route_offload(self, ready: list[int], queued: Mapping[int, int]) -> int | None:
        """The ready HP instance with the fewest requests waiting for a first token."""
        return route_offload([(i, queued.get(i, 0)) for i in self.hp_ids if i in ready])

    def ticket(self, instance_id: int) -> bool:
        """An HP asked for work; False if it is not an HP or already holds a ticket."""
        return instance_id in self.hp_ids and self.tickets.open(instance_id)

    def forget(self, instance_id: int) -> None:
        """An instance went down: its ticket is void."""
        self.tickets.cancel(instance_id)

    def set_roles(self, pool: Sequence[int], hp_ids: Sequence[int]) -> None:
        """The instances' roles changed (`<n>A` layouts): the pool and the HPs now."""
        self.pool, self.hp_ids = sorted(pool), sorted(hp_ids)

    def leave_hp(self, instance_id: int) -> None:
        """An HP is changing role: its ticket is void and no new one counts."""
        self.tickets.cancel(instance_id)
        if instance_id in self.hp_ids:
            self.hp_ids.remove(instance_id)
