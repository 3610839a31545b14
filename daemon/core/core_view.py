"""A read-only view of one controller core: what its driver (daemon/controller.py), /health
(daemon/health.py), /metrics and the gateway's gauges (daemon/gateway_view.py) read of
it. They read through this and never reach the core's components, so a component's
state has one owner and the view is all that others may depend on. Sans-I/O: plain
reads of the core's state as it stands.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from daemon.core.events import RoleSwitched
from daemon.core.ledger import InstanceView
from ipc.messages import Role


class CoreView:
    def __init__(self, core) -> None:
        """`core`: the `ControllerCore` (daemon/core/controller_core.py) it shows."""
        self._core = core
        #: Every instance of the layout, by id (read-only: the ledger's own).
        self.instances: Mapping[int, InstanceView] = MappingProxyType(core.ledger.instances)

    @property
    def accepting(self) -> bool:
        """It takes new requests (every instance was ready once, and no drain began)."""
        return self._core.accepting

    @property
    def draining(self) -> bool:
        return self._core.draining

    def ready_ids(self) -> list[int]:
        """The instances that serve now."""
        return self._core.ledger.ready_ids()

    @property
    def requests_in_flight(self) -> int:
        """Requests accepted and not ended."""
        return len(self._core.ledger.requests)

    @property
    def queued_requests(self) -> int:
        """Requests without a first token (bounded by `max_queued_requests`)."""
        return self._core.ledger.bounds.requests

    @property
    def queued_tokens(self) -> int:
        """Their prompt tokens (bounded by `max_queued_tokens`)."""
        return self._core.ledger.bounds.tokens

    @property
    def max_model_len(self) -> int:
        """The longest context every ready instance serves (0: none is ready)."""
        return self._core.ledger.max_model_len

    def queue_delay(self, request_id: str) -> float | None:
        """How long an accepted request waited before its prefill started (None: it has
        not started, or it has ended)."""
        tracked = self._core.ledger.requests.get(request_id)
        if tracked is None or tracked.prefill_start is None:
            return None
        return tracked.prefill_start - tracked.arrival_time

    def ticket_open(self, instance_id: int) -> bool:
        """The HP holds a ticket: it asked for one new request."""
        return self._core.router.tickets.is_open(instance_id)

    @property
    def dynamic_roles(self) -> bool:
        """An `<n>A` layout: its instances change between LP and HP online."""
        return self._core.roles is not None

    def last_role_change(self, instance_id: int) -> RoleSwitched | None:
        """An `<n>A` layout's instance's last role change, if any."""
        roles = self._core.roles
        return roles.last.get(instance_id) if roles is not None else None

    def role_seconds(self, now: float) -> dict[tuple[int, Role], float]:
        """Seconds each instance has served in each role up to `now` ({}: fixed roles)."""
        roles = self._core.roles
        return roles.role_seconds(now) if roles is not None else {}

    def esp_groups(self) -> list:
        """The ESP groups now (`daemon.core.esp_groups.Group`; [] with ESP off)."""
        esp = self._core.esp
        return list(esp.groups.values()) if esp is not None else []
