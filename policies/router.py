"""Where requests go: the routing state the controller and the simulator share.

Pure bookkeeping around `policies.routing` (open tickets, the round-robin cursor);
the caller says which instances are ready and how loaded they are.

Ascendra layouts (`<n>L<m>H`): a new request takes an HP instance's open ticket,
else goes round-robin over the LP instances; a request an LP offloads goes to the
HP instance with the shortest queue. Other layouts: least-loaded over all instances.
"""
from __future__ import annotations

from collections.abc import Mapping

from policies.admission import TicketBook
from policies.routing import least_loaded, route_new, route_offload


class Router:
    def __init__(self, roles: Mapping[int, str]) -> None:
        self.lp_ids = sorted(i for i, role in roles.items() if role == "lp")
        self.hp_ids = sorted(i for i, role in roles.items() if role == "hp")
        self.tickets = TicketBook()
        self._last = -1

    @property
    def ascendra(self) -> bool:
        return bool(self.lp_ids)

    def route_new(self, ready: list[int], in_flight: Mapping[int, int]) -> tuple[int | None, bool]:
        """(instance for a new request, whether it used an HP ticket)."""
        if not self.ascendra:
            choice = least_loaded([(i, in_flight.get(i, 0)) for i in ready], self._last)
            via_ticket = False
        else:
            lp_ready = [i for i in self.lp_ids if i in ready]
            choice, via_ticket = route_new(self.tickets, lp_ready, self._last)
            if choice is None:  # no LP up: any HP rather than a refusal
                choice = least_loaded([(i, in_flight.get(i, 0)) for i in ready], self._last)
        if choice is not None and not via_ticket:
            self._last = choice
        return choice, via_ticket

    def route_offload(self, ready: list[int], queued: Mapping[int, int]) -> int | None:
        """The ready HP instance with the fewest requests waiting for a first token."""
        return route_offload([(i, queued.get(i, 0)) for i in self.hp_ids if i in ready])

    def ticket(self, instance_id: int) -> bool:
        """An HP asked for work; False if it is not an HP or already holds a ticket."""
        return instance_id in self.hp_ids and self.tickets.open(instance_id)

    def forget(self, instance_id: int) -> None:
        """An instance went down: its ticket is void."""
        self.tickets.cancel(instance_id)
