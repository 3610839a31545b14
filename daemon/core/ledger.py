"""The controller core's books: every accepted request (`Tracked`), every instance
(`InstanceView`) and the admission bounds over the requests without a first token.

The ledger is the one place a request is taken on (`add`), sent to an instance
(`send_to`), handed to a decode instance (`hand_off`), let go by one (`release`), counted
out of the bounds (`unqueue`) and ended (`end`, which emits its `Settle`); and the one
place an instance's readiness, role and a role change under way are written (`ready`,
`down`, `heartbeat`, `set_role`, `start_switch`). It knows no other component: each send and each end is also noted as a
`Sent` or an `Ended`, and the core takes those notes (`take_changes`) to tell the waiting
room and the prefix index, whose structures follow every Submit and every end.
Sans-I/O, like the core.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from daemon.core.admission_bounds import AdmissionBounds, retry_after
from daemon.core.controller_config import ControllerConfig
from daemon.core.events import Action, Send, Settle
from daemon.core.request_state import Outcome, Tracked, Trigger
from ipc.api_codes import EndCode
from ipc.messages import CachedPrompt, Heartbeat, Origin, Ready, Role, Submit

#: The origins of a Submit that moved a request off an LP before its prefill started.
OFFLOADED_ORIGINS = (Origin.OFFLOAD, Origin.RESCUE, Origin.REROUTE)


@dataclass(slots=True)
class InstanceView:
    """What the core knows of one instance."""

    instance_id: int
    role: Role
    ready: Ready | None = None     # None: not serving (starting, restarting)
    stats: Heartbeat | None = None  # its last heartbeat since it became ready
    #: Its batch and KV cache as of its latest report (a step's load or a heartbeat).
    num_running: int = 0
    num_kv_blocks_used: int = 0
    #: Requests it holds, by id (the same `Tracked` as the ledger's: the per-token path
    #: takes it in one look-up), and those of them without a first token (an
    #: insertion-ordered set).
    held: dict[str, Tracked] = field(default_factory=dict)
    waiting: dict[str, None] = field(default_factory=dict)
    #: Requests it completed since the daemon started, as settled here: the one count that
    #: /health and /metrics both show (its heartbeat's count lags and restarts with it).
    num_served: int = 0

    def reported(self, num_running: int, num_kv_blocks_used: int) -> None:
        """Its latest report; one socket per instance keeps them in order, so the last wins."""
        self.num_running, self.num_kv_blocks_used = num_running, num_kv_blocks_used


@dataclass(frozen=True, slots=True)
class Sent:
    """A note: `tracked` was sent to `target` as `submit`."""
    tracked: Tracked
    target: int
    submit: Submit


@dataclass(frozen=True, slots=True)
class Ended:
    """A note: `tracked` had its terminal answer, `outcome`, last held by `holder`."""
    tracked: Tracked
    holder: int | None
    outcome: Outcome


class Ledger:
    def __init__(self, roles: Mapping[int, Role], config: ControllerConfig,
                 ttft_slo: float) -> None:
        self.role_of = dict(roles)
        self.instances = {i: InstanceView(i, role) for i, role in sorted(roles.items())}
        self.requests: dict[str, Tracked] = {}
        self.bounds = AdmissionBounds(config.max_queued_requests, config.max_queued_tokens)
        self.ttft_slo = ttft_slo  # the default, for a dropped request's Retry-After
        #: Instances a role change is under way for (`<n>A` layouts): nothing is bound to
        #: them until it took effect (daemon/core/role_switch.py).
        self.switching: set[int] = set()
        #: Sends and ends since the core last took them, in order.
        self.changes: list[Sent | Ended] = []

    # ---- views -------------------------------------------------------------------------
    def ready_ids(self) -> list[int]:
        return [i for i, view in self.instances.items() if view.ready is not None]

    def serving(self, role: Role) -> list[int]:
        """The ready instances of `role` no role change is under way for."""
        roles, switching = self.role_of, self.switching
        return [i for i, view in self.instances.items()
                if view.ready is not None and roles[i] is role and i not in switching]

    @property
    def max_model_len(self) -> int:
        """The longest context every ready instance serves (0: none is ready)."""
        lens = [v.ready.max_model_len for v in self.instances.values() if v.ready is not None]
        return min(lens) if lens else 0

    def in_flight(self) -> dict[int, int]:
        return {i: len(view.held) for i, view in self.instances.items()}

    def models_held(self) -> dict[int, dict[str, int]]:
        """Each instance's live requests by model (`Submit.model`; multiplexed instances)."""
        out: dict[int, dict[str, int]] = {}
        for i, view in self.instances.items():
            counts = out[i] = {}
            for tracked in view.held.values():
                model = tracked.submit.model
                counts[model] = counts.get(model, 0) + 1
        return out

    def queued(self) -> dict[int, int]:
        """Requests without a first token, per instance that holds them."""
        return {i: len(view.waiting) for i, view in self.instances.items()}

    def waiting_too_long(self, now: float, multiple: float) -> list[Tracked]:
        """Requests an instance holds without a first token for more than `multiple`
        times their TTFT SLO since they arrived."""
        requests = self.requests
        return [tracked for view in self.instances.values() for request_id in view.waiting
                if (tracked := requests.get(request_id)) is not None
                and tracked.first_token_time is None
                and now - tracked.arrival_time > multiple * (tracked.submit.ttft_slo
                                                             or float("inf"))]

    def held(self, request_id: str, view: InstanceView) -> Tracked | None:
        """The request if `view`'s instance holds it now (not a former holder)."""
        return view.held.get(request_id)

    def take_changes(self) -> list[Sent | Ended]:
        """The sends and ends noted since the last call, in order."""
        changes, self.changes = self.changes, []
        return changes

    # ---- instances ---------------------------------------------------------------------
    def ready(self, ready: Ready) -> InstanceView | None:
        """An instance serves (again): its view, None for an id no instance of the layout has."""
        view = self.instances.get(ready.instance_id)
        if view is not None:
            view.ready, view.stats = ready, None
            view.reported(0, 0)
        return view

    def down(self, instance_id: int) -> InstanceView:
        """An instance stopped serving (its process exited): its view, still holding what
        it held."""
        view = self.instances[instance_id]
        view.ready = view.stats = None
        return view

    def heartbeat(self, view: InstanceView, beat: Heartbeat) -> None:
        view.stats = beat
        view.reported(beat.num_running, beat.num_kv_blocks_used)

    # ---- roles (`<n>A` layouts: daemon/core/role_switch.py) ------------------------------
    def set_role(self, instance_id: int, role: Role) -> None:
        self.role_of[instance_id] = role
        self.instances[instance_id].role = role

    def start_switch(self, instance_id: int) -> None:
        """A role change is under way for it: nothing is bound or rescued to it."""
        self.switching.add(instance_id)

    def end_switch(self, instance_id: int) -> None:
        self.switching.discard(instance_id)

    # ---- a request's bookkeeping -------------------------------------------------------
    def add(self, tracked: Tracked) -> None:
        """An accepted request: tracked, and counted against the admission bounds."""
        self.requests[tracked.request_id] = tracked
        self.bounds.add(len(tracked.original.prompt_token_ids))

    def send_to(self, tracked: Tracked, target: int, submit: Submit, out: list[Action]) -> None:
        """Send it to `target`. A new binding starts its list of instances over (one a
        role change gave back never started there); any other origin is a move."""
        view = self.instances[target]
        tracked.instance, tracked.submit = target, submit
        if submit.origin is Origin.NEW:
            tracked.instances = [target]
        else:
            tracked.instances.append(target)
            tracked.offloaded |= submit.origin in OFFLOADED_ORIGINS
        view.held[tracked.request_id] = tracked
        if tracked.waiting:
            view.waiting[tracked.request_id] = None
        self.changes.append(Sent(tracked, target, submit))
        out.append(Send(target, submit))

    def hand_off(self, tracked: Tracked, target: int) -> None:
        """P/D: a prefilled request moves to decode instance `target` (its Submit stays)."""
        self.release(tracked)
        tracked.instance = target
        tracked.instances.append(target)
        self.instances[target].held[tracked.request_id] = tracked

    def release(self, tracked: Tracked) -> None:
        if tracked.instance is not None:
            view = self.instances[tracked.instance]
            view.held.pop(tracked.request_id, None)
            view.waiting.pop(tracked.request_id, None)
            tracked.instance = None

    def unqueue(self, tracked: Tracked) -> None:
        """It got its first token or ended: it no longer waits (once per request)."""
        if tracked.waiting:
            self.bounds.remove(len(tracked.original.prompt_token_ids))
            if tracked.instance is not None:
                self.instances[tracked.instance].waiting.pop(tracked.request_id, None)

    def found_cached(self, view: InstanceView, cached: Iterable[CachedPrompt]) -> None:
        """`view`'s instance admitted these requests with part of their prompts cached."""
        for hit in cached:
            tracked = self.held(hit.request_id, view)
            if tracked is not None and tracked.first_token_time is None:
                tracked.num_cached_tokens = hit.num_cached_tokens

    def admitted(self, view: InstanceView, request_ids: Iterable[str], at: float) -> None:
        """`view`'s instance started these requests' prefills at `at`; the first time counts."""
        for request_id in request_ids:
            tracked = self.held(request_id, view)
            if tracked is not None and tracked.prefill_start is None:
                tracked.prefill_start = max(at, tracked.arrival_time)

    def end(self, tracked: Tracked, outcome: Outcome, code: EndCode | None, message: str,
            out: list[Action]) -> None:
        """Its one terminal answer: forgotten everywhere, and its `Settle` emitted."""
        holder = tracked.instance
        self.unqueue(tracked)
        self.release(tracked)
        tracked.advance(Trigger.ENDED)
        del self.requests[tracked.request_id]
        e2e = (tracked.last_token_time - tracked.arrival_time
               if tracked.last_token_time is not None else None)
        again = retry_after(self.ttft_slo) if outcome is Outcome.DROPPED else None
        self.changes.append(Ended(tracked, holder, outcome))
        if outcome is Outcome.COMPLETED and holder is not None:
            self.instances[holder].num_served += 1
        started = tracked.prefill_start
        out.append(Settle(tracked.request_id, outcome, code, message, holder, e2e, again,
                          len(tracked.original.prompt_token_ids), tracked.num_cached_tokens,
                          tracked.served_as, tuple(tracked.instances), tracked.offloaded,
                          None if started is None else started - tracked.arrival_time,
                          tracked.tenant, len(tracked.token_ids),
                          None if tracked.first_token_time is None
                          else tracked.first_token_time - tracked.arrival_time))
