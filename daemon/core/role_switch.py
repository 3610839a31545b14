"""The controller core's role switching for `<n>A` layouts (docs/design.md §5.10): the
component that asks `policies.roles.decide` whether an instance should change between LP
and HP, sends it `SetRole`, and applies the change when the instance's `RoleChanged`
says it took effect. Sans-I/O, like the core.

A change is under way from the `SetRole` until its answer: the instance is in
`Ledger.switching` (nothing is bound or rescued to it; an HP leaving gives up its
ticket at once). When it took effect the ledger's and the router's roles follow, and
`changed` returns the waiting requests the instance gave back (prefill not started): the
core puts them in the waiting room again, as new requests, for the next plan to bind
them. An instance that restarts comes back in the role it started in (its Ready says
so), any change under way forgotten.

The component owns its evidence (daemon/core/role_evidence.py): the core tells it of
arrivals, of what the waiting room's plans set aside (`set_aside`) and of the offloads
an HP took; it reads the waiting room's backlogs, and its reading of the window (are
arrivals bursty?) is the core's to pass on to the room (`in_bursts`).
"""
from __future__ import annotations

import msgspec

from daemon.core.events import Action, RoleSwitched, Send
from daemon.core.ledger import InstanceView, Ledger
from daemon.core.request_state import Tracked, Trigger
from daemon.core.role_evidence import RoleEvidence
from daemon.core.waiting_room import SetAside, WaitingRoom
from ipc.messages import Origin, Ready, Role, RoleChanged, SetRole
from policies.roles import RoleParams, Seat, decide, in_bursts
from policies.router import Router

#: Seconds between two looks at the evidence.
CHECK_INTERVAL = 1.0
#: The roles that change, and the mode (and the policy's name) of each.
_MODE = {Role.LP: "lp", Role.HP: "hp"}
_ROLE = {mode: role for role, mode in _MODE.items()}


class Roles:
    def __init__(self, ledger: Ledger, router: Router, room: WaitingRoom,
                 params: RoleParams = RoleParams()) -> None:
        """`room`: read for its backlogs only."""
        self.ledger, self.router, self.room = ledger, router, room
        self.params = params
        self.evidence = RoleEvidence(
            params.window, params.burst_horizon if params.hps_in_bursts else None)
        #: The last reading of the window: arrivals come in bursts.
        self.in_bursts = False
        #: When each instance took its role (-inf: it started in it).
        self.since: dict[int, float] = {i: -float("inf") for i in ledger.role_of}
        #: Each instance's last change, for /health.
        self.last: dict[int, RoleSwitched] = {}
        #: Changes sent and not answered yet: instance -> (role, reason).
        self.pending: dict[int, tuple[Role, str]] = {}
        self.last_change = -float("inf")
        self.next_check = 0.0
        #: Seconds each instance has served in each role, up to the start of its current
        #: role (`stint`: since when, from its first Ready).
        self.seconds: dict[tuple[int, Role], float] = {}
        self.stint: dict[int, float] = {}

    # ---- what it hears -----------------------------------------------------------------
    def arrived(self, now: float, ttft_slo: float) -> None:
        self.evidence.arrived(now, ttft_slo)

    def took_offload(self, now: float, hp: int) -> None:
        self.evidence.took(now, hp)

    def set_aside(self, now: float, aside: SetAside) -> None:
        """A plan of the waiting room set requests aside (rescued or shed)."""
        self.evidence.set_aside(now, aside.rescued_by, aside.rescuable_late)

    def ready(self, now: float, ready: Ready) -> None:
        """An instance serves (again), in the role its Ready names."""
        i = ready.instance_id
        self.pending.pop(i, None)
        self.ledger.end_switch(i)
        if i in self.stint:
            self._count(i, now)
        self.stint[i] = now
        if ready.role in _MODE and self.ledger.role_of.get(i) is not ready.role:
            self._set(i, ready.role)
            self.since[i] = -float("inf")

    def role_seconds(self, now: float) -> dict[tuple[int, Role], float]:
        """Seconds each instance has served in each role up to `now`."""
        seconds = dict(self.seconds)
        for i, start in self.stint.items():
            key = (i, self.ledger.role_of[i])
            seconds[key] = seconds.get(key, 0.0) + max(now - start, 0.0)
        return seconds

    def _count(self, instance_id: int, now: float) -> None:
        key = (instance_id, self.ledger.role_of[instance_id])
        self.seconds[key] = self.seconds.get(key, 0.0) + max(now - self.stint[instance_id], 0.0)
        self.stint[instance_id] = now

    # ---- deciding ----------------------------------------------------------------------
    def tick(self, now: float, out: list[Action]) -> None:
        """At most every CHECK_INTERVAL: read the window (`in_bursts`), ask the policy,
        and start the change it decides."""
        if now < self.next_check or self.pending:
            return
        self.next_check = now + CHECK_INTERVAL
        ledger, room = self.ledger, self.room
        window, rescued = self.evidence.read(now, self.params.tight_ratio)
        self.in_bursts = in_bursts(window, self.params)
        seats = [Seat(i, _MODE[ledger.role_of[i]], self.since[i], room.backlog_seconds(i),
                      rescued.get(i, 0))
                 for i in ledger.ready_ids() if ledger.role_of[i] in _MODE]
        change = decide(seats, window, now, self.last_change, self.params)
        if change is not None:
            self.switch(change.instance_id, _ROLE[change.role], change.reason, out)

    def switch(self, instance_id: int, role: Role, reason: str, out: list[Action]) -> None:
        """Start changing `instance_id` to `role`: nothing more is bound to it until its
        answer; an HP leaving holds no ticket from now."""
        self.pending[instance_id] = (role, reason)
        self.ledger.start_switch(instance_id)
        self.router.leave_hp(instance_id)
        out.append(Send(instance_id, SetRole(role=role, mode=_MODE[role])))

    # ---- the answer --------------------------------------------------------------------
    def changed(self, now: float, view: InstanceView, message: RoleChanged,
                out: list[Action]) -> list[Tracked]:
        """The instance serves as `message.role` from now: the books follow. Returns what
        it gave back, for the waiting room."""
        i = view.instance_id
        _, reason = self.pending.pop(i, (message.role, "asked elsewhere"))
        self.ledger.end_switch(i)
        old = self.ledger.role_of[i]
        returned = self._take_back(view, message)
        if message.load is not None:  # its backlog without them
            view.reported(message.load.num_running, message.load.num_kv_blocks_used)
        if i in self.stint and message.role is not old:
            self._count(i, now)
        self._set(i, message.role)
        if message.role is not old:
            self.since[i] = self.last_change = now
            switched = RoleSwitched(i, old, message.role, reason, now, len(returned))
            self.last[i] = switched
            out.append(switched)
        return returned

    def _take_back(self, view: InstanceView, message: RoleChanged) -> list[Tracked]:
        """The waiting requests it gave back, let go of: PENDING again, as new requests."""
        ledger, returned = self.ledger, []
        for gone in message.returned:
            tracked = ledger.held(gone.request_id, view)
            if tracked is None:
                continue  # ended meanwhile (its client left)
            ledger.release(tracked)
            tracked.advance(Trigger.REQUEUED)
            if tracked.submit.origin is not Origin.NEW:
                tracked.submit = msgspec.structs.replace(tracked.submit, origin=Origin.NEW)
            returned.append(tracked)
        return returned

    def _set(self, instance_id: int, role: Role) -> None:
        ledger, router = self.ledger, self.router
        ledger.set_role(instance_id, role)
        router.set_roles([i for i, r in ledger.role_of.items() if r is Role.LP],
                         [i for i, r in ledger.role_of.items() if r is Role.HP])
        if role is not Role.HP:
            router.tickets.cancel(instance_id)
