"""The controller core's late binding (docs/design.md §5.6): the component that owns the
waiting room and binds its requests to instances, rescues them on an HP or sheds them.
Sans-I/O, like the core.

Requests of an Ascendra layout with the global queue wait in the `WaitingRoom`
(daemon/core/waiting_room.py) until `policies.global_queue.plan` binds them to an LP
whose predicted prefill backlog is under `bind_steps` of its token budgets, rescues them
on an HP that can still finish them in time, or sheds them; every event that changes a
backlog or the queue runs `bind_waiting`. An HP holding an open ticket takes one request
first (`policies.ticket_pick`). `gated_hp` is the HP gate: the ready HP that can finish a
request's prefill before its deadline, for rescues and LP offloads alike.
"""
from __future__ import annotations

import msgspec

from daemon.core.controller_config import ControllerConfig
from daemon.core.events import Action, Moved, Send, StartTimer, Timer
from daemon.core.ledger import Ledger
from daemon.core.request_state import Outcome, Tracked, Trigger
from daemon.core.role_evidence import RoleEvidence
from daemon.core.waiting_room import WaitingRoom
from ipc.api_codes import EndCode
from ipc.messages import Abort, InstanceLoad, Origin, Ready, Role, Submit
from policies.admission import TicketBook
from policies.global_queue import Plan, Waiting
from policies.ticket_pick import ticket_pick

#: Seconds between plans of a queue no LP can take more from (rescue and shed decisions).
PLAN_INTERVAL = 0.05
#: Seconds between looks for requests past their longest wait (`end_overdue`).
OVERDUE_CHECK = 0.25
OVERDUE = "overdue"


class LateBinding:
    def __init__(self, room: WaitingRoom, ledger: Ledger, tickets: TicketBook,
                 config: ControllerConfig) -> None:
        self.room = room          # the ledger keeps its backlogs and membership in step
        self.ledger = ledger
        self.tickets = tickets    # the router's: HPs asking for one new request each
        self.config = config
        self.last_plan = -float("inf")
        self.watching = False     # the OVERDUE timer is set
        #: An `<n>A` layout's role evidence (daemon/core/role_evidence.py): what the
        #: plans set aside. None: roles are fixed.
        self.evidence: RoleEvidence | None = None

    # ---- what the waiting room hears ---------------------------------------------------
    def add(self, tracked: Tracked) -> None:
        """A new request waits (PENDING) for an instance."""
        self.room.add(tracked)

    def requeue(self, tracked: Tracked) -> None:
        """An LP's offload no HP can finish in time waits again, pinned to the LPs."""
        tracked.advance(Trigger.REQUEUED)
        tracked.requeued = True
        self.room.add(tracked)

    def ready(self, ready: Ready) -> None:
        self.room.ready(ready)

    def reported(self, instance_id: int, load: InstanceLoad) -> None:
        self.room.reported(instance_id, load)

    def forget(self, instance_id: int) -> None:
        self.room.forget(instance_id)

    # ---- binding -----------------------------------------------------------------------
    def bind_waiting(self, now: float, out: list[Action]) -> None:
        """Apply a plan of the waiting room: shed, rescue on an HP, give an HP that holds
        a ticket one request, bind the rest to LPs. A plan looks at the whole queue, so it
        runs when it can bind something (an LP under its bound, an open ticket) or
        `PLAN_INTERVAL` after the last one (for rescues and sheds), not on every event of
        a busy queue."""
        room, ledger = self.room, self.ledger
        if not len(room):
            return
        lps = ledger.serving(Role.LP)
        bound = self._bound(lps)
        if not self._worth_planning(now, lps, bound):
            return
        self.last_plan = now
        hps = ledger.serving(Role.HP)
        if not lps and not hps:
            return
        plan, by_id = room.plan(now, lps, hps, bound)
        if self.evidence is not None and (plan.to_hp or plan.shed):
            self.evidence.set_aside(now, [hp for _, hp in plan.to_hp], sum(
                1 for w in plan.shed if now + w.hp_cost <= w.deadline))
        for w in plan.shed:
            ledger.end(by_id[w.key], Outcome.DROPPED, EndCode.TTFT_SLO_MISSED,
                       "dropped: it was predicted to miss its TTFT SLO on every instance", out)
        for w, target in plan.to_hp:
            self._bind(by_id[w.key], target, Origin.OFFLOAD, out, w.favoured)
        ticketed = self._serve_ticket(plan, by_id, out)
        for w, target in plan.to_lp:
            if w is ticketed:
                continue
            tracked = by_id[w.key]  # one an LP gave up before returns pinned: no ping-pong
            self._bind(tracked, target, Origin.REROUTE if tracked.requeued else Origin.NEW, out,
                       w.favoured)

    def watch_waits(self, now: float, out: list[Action]) -> None:
        """A request arrived: make sure the OVERDUE timer runs."""
        if not self.watching:
            self.watching = True
            out.append(StartTimer(Timer(OVERDUE), now + OVERDUE_CHECK))

    def end_overdue(self, now: float, out: list[Action]) -> None:
        """The OVERDUE timer: a request without a first token that would pass
        `max_wait_slo_multiple` times its TTFT SLO before the next look ends now (503) --
        in the waiting room, or held by an instance, which is told to abort it: a band
        served first at an LP, or an HP's long queue, must not keep it waiting for ever.
        Looks again in OVERDUE_CHECK seconds while any request has no first token."""
        ledger = self.ledger
        multiple, by = self.config.max_wait_slo_multiple, now + OVERDUE_CHECK
        for tracked in self.room.waited_too_long(by, multiple) + ledger.waiting_too_long(
                by, multiple):
            holder = tracked.instance   # None: still in the waiting room
            ledger.end(tracked, Outcome.DROPPED, EndCode.TTFT_SLO_MISSED,
                       f"dropped: it waited {now - tracked.arrival_time:.1f} s for its first "
                       f"token, about {multiple:g} times its TTFT SLO", out)
            if holder is not None:
                out.append(Send(holder, Abort(request_id=tracked.request_id)))
        self.watching = ledger.bounds.requests > 0
        if self.watching:
            out.append(StartTimer(Timer(OVERDUE), now + OVERDUE_CHECK))

    def _serve_ticket(self, plan: Plan, by_id: dict[str, Tracked], out: list[Action],
                      ) -> Waiting | None:
        """An HP holding a ticket is idle enough to start a new request now: it takes one
        before the LPs do (policies/ticket_pick.py picks which), else it would get only
        what the LPs' bound leaves over. Returns the request it took, if any."""
        if not self.tickets:
            return None
        candidates = [w for w, _ in plan.to_lp] + plan.order
        if not candidates:
            return None
        hp = self.tickets.take()
        chosen = candidates[ticket_pick(candidates, hp)]
        self._bind(by_id[chosen.key], hp, Origin.NEW, out, chosen.favoured)
        return chosen

    def _worth_planning(self, now: float, lps: list[int], bound: int) -> bool:
        """Whether a plan now may bind something (an LP of `lps`, those serving, under
        `bound`; an open ticket) or the last one is `PLAN_INTERVAL` old."""
        if now - self.last_plan >= PLAN_INTERVAL or self.tickets:
            return True
        return any(self.room.backlog_tokens(i) < bound for i in lps)

    def _bound(self, lps: list[int]) -> int:
        """Prompt tokens an LP (of `lps`, those serving) may have queued and still take more."""
        lp = next((self.ledger.instances[i].ready for i in lps), None)
        return round(self.config.bind_steps * ((lp.token_budget if lp else 0) or 2048))

    def _bind(self, tracked: Tracked, target: int, origin: Origin, out: list[Action],
              favoured: bool = False) -> None:
        """`favoured`: its tenant is under its share now; the instance serves it first in
        its band."""
        self.room.remove(tracked)
        tracked.advance(Trigger.BOUND)
        submit = tracked.submit
        if favoured != submit.favoured:
            submit = msgspec.structs.replace(submit, favoured=favoured)
        if origin is not Origin.NEW:
            submit = msgspec.structs.replace(submit, origin=origin)
            out.append(Moved(tracked.request_id, origin, None, target))
        self.ledger.send_to(tracked, target, submit, out)

    # ---- the HP gate -------------------------------------------------------------------
    def gated_hp(self, now: float, submit: Submit, cached_on: dict[int, int] | None = None,
                 ) -> int | None:
        """The ready HP that can finish `submit`'s prefill before its deadline soonest,
        counting only the prompt tokens it would not find cached (`cached_on`)."""
        best = None
        cached_on = cached_on or {}
        ledger = self.ledger
        for i in ledger.serving(Role.HP):
            tokens = (self.room.backlog_tokens(i) + len(submit.prompt_token_ids)
                      - cached_on.get(i, 0))
            finish = now + self.room.seconds(i, tokens)
            if finish <= submit.deadline and (best is None or finish < best[0]):
                best = (finish, i)
        return best[1] if best else None
