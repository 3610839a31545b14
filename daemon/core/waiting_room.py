"""The controller's waiting room (docs/design.md §5.6): the component of an Ascendra
layout with the global queue that owns the requests no instance holds yet, what it
predicts of each instance's prefill backlog (daemon/core/backlogs.py), their binding to
instances and the HP gate. Sans-I/O, like the core.

A new request waits here until `policies.global_queue.plan` binds it to an LP whose
predicted prefill backlog is under `bind_steps` of its token budgets, rescues it on an
HP that can still finish it in time, or sheds it; the core runs `bind` after every event
that changes a backlog or the queue. An HP holding an open ticket takes one request
first (`policies.ticket_pick`). `gated_hp` is the HP gate: the ready HP that can finish a
request's prefill before its deadline, for rescues and LP offloads alike. A plan's
decisions come back as a `Binding` that the core carries out through the ledger; the
core then tells the room what was sent and what ended (`sent`, `ended`), whoever sent or
ended it, so its backlogs and queue follow. The room reads the ledger and writes only
its own state. On its OVERDUE timer it names the requests that waited too long
(`overdue`), for the core to end.

A waiting request's own prefill on an LP is priced at the faster of the LPs' measured
rate and one whole step's (`WaitingRoom.lp_prompt_rate`).
"""
from __future__ import annotations

import bisect
import itertools
from collections import deque
from typing import NamedTuple

import msgspec

from daemon.core.backlogs import Backlog, model_rate
from daemon.core.controller_config import ControllerConfig
from daemon.core.events import Action, StartTimer, Timer
from daemon.core.ledger import Ledger
from daemon.core.request_state import Outcome, Tracked, Trigger
from ipc.messages import InstanceLoad, Origin, Ready, Role, Submit
from policies.admission import TicketBook
from policies.class_floor import PromptClasses
from policies.slo_class_floor import SloClasses, target_key
from policies.global_queue import Lane, Plan, Shed, Waiting, miss_allowance, plan
from policies.routing import Routing
from policies.tenants import TenantShares
from policies.ticket_pick import ticket_pick

#: Requests planned per pass, earliest deadlines first (Moore-Hodgson's decisions for a
#: deadline-ordered prefix do not depend on what comes after it).
HORIZON = 512
#: How much slower than its model's prefill-alone rate (measured at the token budget) an
#: LP is taken to run a long prompt whole, beside its step's decodes and with attention
#: over the whole prompt: the plan's price of a prompt an LP would run whole
#: (`tbt_budget.whole_prefill_pays`). Chosen on the fair ruler (docs/fairness.md: 1.1
#: bought fair capacity with more than 5 % of capacity, 1.35 bought nothing).
WHOLE_PREFILL_SLOWDOWN = 1.2
#: The same for an HP rescuing a late prompt (design.md §5.7: an HP runs a prompt whole
#: when only that meets its TTFT): its rescue is priced at the faster of its measured rate
#: and its model's prefill-alone rate this many times slower. Chosen on the fair ruler
#: (docs/fairness.md, "An HP's rescue priced at its whole-step rate"): 1.0 cost one
#: shifting seed a fifth of its capacity, 1.2 left mixed-slo's longest prompts where they were.
HP_WHOLE_PREFILL_SLOWDOWN = 1.1
#: Seconds over which the miss budget counts arrivals and drops.
MISS_WINDOW = 60.0
#: Seconds the box counts as saturated after a plan set aside a request that was not
#: sheddable: sheddable requests (priority < 0) are shed on sight meanwhile.
SATURATION_MEMORY = 5.0
#: Seconds between plans of a queue no LP can take more from (rescue and shed decisions).
PLAN_INTERVAL = 0.05
#: Seconds between looks for requests past their longest wait (`end_overdue`).
OVERDUE_CHECK = 0.25
OVERDUE = "overdue"


class SetAside(NamedTuple):
    """What a plan set aside, for an `<n>A` layout's role evidence (role_evidence.py)."""
    rescued_by: list[int]   # the HP each rescued request went to
    rescuable_late: int     # shed requests an idle HP would have finished in time


class Bound(NamedTuple):
    """A request the room let go of: to `target` as `submit`; `moved`: a rescue or a
    reroute (its origin says which), not a new request's first binding."""
    tracked: Tracked
    target: int
    submit: Submit
    moved: bool


class Binding(NamedTuple):
    """What one plan decided, for the core to carry out in this order."""
    shed: list[Tracked]       # predicted to miss their TTFT SLO everywhere: dropped
    bound: list[Bound]        # rescues, then an HP's ticket, then the LPs'
    aside: SetAside | None    # what it set aside, if anything


class WaitingRoom:
    def __init__(self, config: ControllerConfig, ledger: Ledger, tickets: TicketBook,
                 tenants: TenantShares | None = None, per_lp: bool = False) -> None:
        """`per_lp`: the plan places each request on the LP that frees up first, not on
        the pool (`policies.global_queue.plan`); with ESP groups on, where an LP holds a
        long prompt whole for seconds beside LPs that are idle."""
        self.config = config
        self.per_lp = per_lp
        self.ledger = ledger
        self.tickets = tickets    # the router's: HPs asking for one new request each
        self.shed = Shed(config.shed)
        self.rescue = config.hp_gate
        #: Price each request per instance by the prompt tokens it would not find cached
        #: there (`Tracked.cached_on`), so binding prefers an LP holding its prefix.
        self.prefix_aware = config.routing is Routing.PREFIX_AWARE
        self.miss_budget = config.miss_budget
        self._arrivals: deque[float] = deque()   # arrival times within MISS_WINDOW
        self._drops: deque[float] = deque()      # times of the plans' drops, likewise
        self._queue: list[tuple[tuple, Tracked]] = []   # sorted by their keys
        self._keys: dict[str, tuple] = {}
        self._seq = itertools.count()
        self.backlogs: dict[int, Backlog] = {}
        #: The class floor's classes and their recent TTFT record (docs/design.md §5.8):
        #: prompt-length quartiles, or the requests' TTFT targets (`class_floor_by`).
        self.by_slo = config.class_floor_by == "slo"
        self.classes = (SloClasses if self.by_slo else PromptClasses)(floor=config.class_floor)
        #: Tenants' counters, when service is shared by weight (docs/design.md §5.11).
        self.tenants = tenants
        self.last_saturated = -float("inf")   # the last plan that set aside a request not sheddable
        self.last_plan = -float("inf")
        self.watching = False     # the OVERDUE timer is set

    # ---- the queue ---------------------------------------------------------------------
    def add(self, tracked: Tracked, again: bool = False) -> None:
        """A request waits (PENDING) for an instance. `again`: it waited here before (an
        instance changing role gave it back): its arrival is counted already."""
        submit = tracked.submit
        key = (-submit.priority, submit.deadline, tracked.arrival_time, next(self._seq))
        if not tracked.requeued and not again:
            self._arrivals.append(tracked.arrival_time)
            if self.classes.active:
                self.classes.arrived(self._class_key(tracked))
            if self._shares_count(tracked):
                self.tenants.arrived(tracked.tenant)
        self._keys[tracked.request_id] = key
        bisect.insort(self._queue, (key, tracked), key=lambda item: item[0])

    def bound_elsewhere(self, tracked: Tracked) -> None:
        """A new request another component binds at once (an ESP group,
        daemon/core/esp_groups.py): counted as an arrival (rates, classes, tenants), but
        never queued; QUEUED."""
        self.add(tracked)
        self._remove(tracked)
        tracked.advance(Trigger.BOUND)

    def requeue(self, tracked: Tracked) -> None:
        """An LP's offload no HP can finish in time waits again, pinned to the LPs."""
        tracked.advance(Trigger.REQUEUED)
        tracked.requeued = True
        self.add(tracked)

    def _remove(self, tracked: Tracked) -> None:
        key = self._keys.pop(tracked.request_id, None)
        if key is not None:
            i = bisect.bisect_left(self._queue, key, key=lambda item: item[0])
            del self._queue[i]

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._keys

    def __len__(self) -> int:
        return len(self._queue)

    def _waited_too_long(self, now: float, multiple: float) -> list[Tracked]:
        """Requests that have waited more than `multiple` times their TTFT SLO."""
        return [t for _, t in self._queue
                if now - t.arrival_time > multiple * (t.submit.ttft_slo or float("inf"))]

    # ---- what the core tells it --------------------------------------------------------
    def sent(self, tracked: Tracked, target: int, submit: Submit) -> None:
        """A Submit went to `target`: its backlog grows by what it will compute there --
        the prompt less a prefix it is known to cache."""
        backlog = self.backlogs.get(target)
        if backlog is not None:
            backlog.add(len(submit.prompt_token_ids) - tracked.cached_on.get(target, 0),
                        submit.priority < 0)

    def ended(self, tracked: Tracked, outcome: Outcome) -> None:
        """A request had its terminal answer: it leaves the queue if it waited here, its
        tenant's count, and (dropped before a first token) counts as its class's miss."""
        self._remove(tracked)
        if self._shares_count(tracked):
            self.tenants.ended(tracked.tenant)
        if outcome is Outcome.DROPPED and tracked.first_token_time is None:
            self.answered(tracked, met=False)

    def answered(self, tracked: Tracked, met: bool) -> None:
        """A request got its first answer: its first token (`met`: by its deadline), or
        a drop. Its class's record (the class floor) counts it."""
        if self.classes.active:
            self.classes.answered(self._class_key(tracked), met)

    def _class_key(self, tracked: Tracked) -> int:
        """What its class floor's class is of: its prompt length, or its TTFT target."""
        if self.by_slo:
            return target_key(tracked.original.ttft_slo)
        return len(tracked.original.prompt_token_ids)

    @property
    def counts_tokens(self) -> bool:
        """Its fair shares count every computed token (two tenants or more seen)."""
        return self.tenants is not None and self.tenants.counting

    def computed(self, tracked: Tracked, tokens: int) -> None:
        """`tokens` more were computed for it (what its tenant's fair share counts)."""
        if self._shares_count(tracked):
            self.tenants.computed(tracked.tenant, tokens)

    def _shares_count(self, tracked: Tracked) -> bool:
        """Fair shares are kept among requests that are not sheddable: sheddable traffic
        (priority < 0) takes only what the rest leaves, so it claims no share -- else a
        tenant whose sheddable requests are shed would stand under its share and be
        served first, its requests jumping the queues of a higher band and the HPs held
        back for it."""
        return self.tenants is not None and tracked.submit.priority >= 0

    def ready(self, ready: Ready) -> None:
        self.backlogs[ready.instance_id] = Backlog(model_rate(ready))

    def reported(self, instance_id: int, load: InstanceLoad) -> None:
        if instance_id in self.backlogs:
            self.backlogs[instance_id].report(load)

    def forget(self, instance_id: int) -> None:
        self.backlogs.pop(instance_id, None)

    def set_bursts(self, in_bursts: bool) -> None:
        """The role policy's reading (`<n>A` layouts): arrivals come in bursts, so the
        class floor protects no class (policies/class_floor.py)."""
        self.classes.in_bursts = in_bursts

    # ---- backlogs ----------------------------------------------------------------------
    def backlog_tokens(self, instance_id: int) -> int:
        return self.backlogs[instance_id].tokens

    def seconds(self, instance_id: int, tokens: float) -> float:
        """Predicted seconds for `instance_id` to prefill `tokens` more prompt tokens."""
        return tokens / self.backlogs[instance_id].rate

    def backlog_seconds(self, instance_id: int) -> float:
        """Predicted seconds for `instance_id` to prefill its backlog (0: not ready)."""
        if instance_id not in self.backlogs:
            return 0.0
        return self.seconds(instance_id, self.backlog_tokens(instance_id))

    # ---- binding -----------------------------------------------------------------------
    def arrived(self, tracked: Tracked, now: float, out: list[Action]) -> Binding | None:
        """A new request waits here; the OVERDUE timer runs; a plan binds what it can."""
        self.add(tracked)
        self.watch_waits(now, out)
        return self.bind(now)

    def bind(self, now: float) -> Binding | None:
        """A plan of the queue: shed, rescue on an HP, give an HP that holds a ticket one
        request, bind the rest to LPs; the bound leave the queue (the shed, once they
        ended). A plan looks at the whole queue, so it runs when it can bind something
        (an LP under its bound, an open ticket) or `PLAN_INTERVAL` after the last one (for
        rescues and sheds), not on every event of a busy queue."""
        ledger = self.ledger
        if not len(self):
            return None
        lps = ledger.serving(Role.LP)
        bound = self._bound(lps)
        if not self._worth_planning(now, lps, bound):
            return None
        self.last_plan = now
        hps = ledger.serving(Role.HP)
        if not lps and not hps:
            return None
        decided, by_id = self.plan(now, lps, hps, bound)
        sends = [self._bind(by_id[w.key], target, Origin.RESCUE, w.favoured)
                  for w, target in decided.to_hp]
        ticketed = self._serve_ticket(decided, by_id)
        if ticketed is not None:
            sends.append(ticketed[1])
        for w, target in decided.to_lp:
            if ticketed is not None and w is ticketed[0]:
                continue
            tracked = by_id[w.key]  # one an LP gave up before returns pinned: no ping-pong
            origin = Origin.REROUTE if tracked.requeued else Origin.NEW
            sends.append(self._bind(tracked, target, origin, w.favoured))
        aside = None
        if decided.to_hp or decided.shed:
            aside = SetAside([hp for _, hp in decided.to_hp],
                             sum(1 for w in decided.shed if now + w.hp_cost <= w.deadline))
        return Binding([by_id[w.key] for w in decided.shed], sends, aside)

    def watch_waits(self, now: float, out: list[Action]) -> None:
        """A request arrived: make sure the OVERDUE timer runs."""
        if not self.watching:
            self.watching = True
            out.append(StartTimer(Timer(OVERDUE), now + OVERDUE_CHECK))

    def overdue(self, now: float) -> list[Tracked]:
        """The OVERDUE timer: every request without a first token that would pass
        `max_wait_slo_multiple` times its TTFT SLO before the next look -- waiting here,
        or held by an instance: a band served first at an LP, or an HP's long queue, must
        not keep it waiting for ever."""
        multiple, by = self.config.max_wait_slo_multiple, now + OVERDUE_CHECK
        return self._waited_too_long(by, multiple) + self.ledger.waiting_too_long(by, multiple)

    def look_again(self, now: float, any_waiting: bool, out: list[Action]) -> None:
        """After a look: the next in OVERDUE_CHECK seconds, while any request has no first
        token (`any_waiting`)."""
        self.watching = any_waiting
        if any_waiting:
            out.append(StartTimer(Timer(OVERDUE), now + OVERDUE_CHECK))

    def _serve_ticket(self, decided: Plan, by_id: dict[str, Tracked],
                      ) -> tuple[Waiting, Bound] | None:
        """An HP holding a ticket is idle enough to start a new request now: it takes one
        before the LPs do (policies/ticket_pick.py picks which), else it would get only
        what the LPs' bound leaves over. Returns the request it took, if any."""
        if not self.tickets:
            return None
        candidates = [w for w, _ in decided.to_lp] + decided.order
        if not candidates:
            return None
        hp = self.tickets.take()
        chosen = candidates[ticket_pick(candidates, hp)]
        return chosen, self._bind(by_id[chosen.key], hp, Origin.NEW, chosen.favoured)

    def _worth_planning(self, now: float, lps: list[int], bound: int) -> bool:
        """Whether a plan now may bind something (an LP of `lps`, those serving, under
        `bound`; an open ticket) or the last one is `PLAN_INTERVAL` old."""
        if now - self.last_plan >= PLAN_INTERVAL or self.tickets:
            return True
        return any(self.backlog_tokens(i) < bound for i in lps)

    def _bound(self, lps: list[int]) -> int:
        """Prompt tokens an LP (of `lps`, those serving) may have queued and still take more."""
        lp = next((self.ledger.instances[i].ready for i in lps), None)
        return round(self.config.bind_steps * ((lp.token_budget if lp else 0) or 2048))

    def _bind(self, tracked: Tracked, target: int, origin: Origin,
              favoured: bool = False) -> Bound:
        """It leaves the queue for `target`. `favoured`: its tenant is under its share
        now; the instance serves it first in its band."""
        self._remove(tracked)
        tracked.advance(Trigger.BOUND)
        submit = tracked.submit
        if favoured != submit.favoured:
            submit = msgspec.structs.replace(submit, favoured=favoured)
        if origin is not Origin.NEW:
            submit = msgspec.structs.replace(submit, origin=origin)
        return Bound(tracked, target, submit, origin is not Origin.NEW)

    # ---- the HP gate -------------------------------------------------------------------
    def gated_hp(self, now: float, submit: Submit, cached_on: dict[int, int] | None = None,
                 ) -> int | None:
        """The ready HP that can finish `submit`'s prefill before its deadline soonest,
        counting only the prompt tokens it would not find cached (`cached_on`)."""
        best = None
        cached_on = cached_on or {}
        for i in self.ledger.serving(Role.HP):
            tokens = self.backlog_tokens(i) + len(submit.prompt_token_ids) - cached_on.get(i, 0)
            finish = now + self.seconds(i, tokens)
            if finish <= submit.deadline and (best is None or finish < best[0]):
                best = (finish, i)
        return best[1] if best else None

    # ---- the plan ----------------------------------------------------------------------
    def plan(self, now: float, lps: list[int], hps: list[int], bound_tokens: int,
             ) -> tuple[Plan, dict[str, Tracked]]:
        """`policies.global_queue.plan` over the earliest-deadline HORIZON requests; the
        rest keep their place behind them. Returns the plan and the requests by id."""
        head = self._queue[:HORIZON]
        by_id = {t.request_id: t for _, t in head}
        lp_rate = sum(self.backlogs[i].rate for i in lps) / len(lps) if lps else 1.0
        hp_rate = sum(self.backlogs[i].rate for i in hps) / len(hps) if hps else lp_rate
        prompt_rate = self.lp_prompt_rate(lps, lp_rate)
        waiting = []
        classes, shares = self.classes, self._shares()
        favoured = shares.favoured() if shares is not None else frozenset()
        protected = classes.protected()
        for _, t in head:
            tokens = len(t.submit.prompt_token_ids)
            klass = classes.of(self._class_key(t)) if classes.active else 0
            # an SLO class under its floor is served first, as a tenant under its share
            first = t.tenant in favoured or (self.by_slo and klass in protected)
            if self.prefix_aware and t.cached_on:
                waiting.append(_priced_per_instance(t, tokens, lps, hps, prompt_rate, hp_rate,
                                                    klass, first))
                continue
            waiting.append(Waiting(t.request_id, t.arrival_time, t.submit.deadline,
                                   tokens / prompt_rate, tokens / hp_rate, t.submit.priority,
                                   klass=klass, tenant=t.tenant, tokens=tokens,
                                   favoured=first))
        lanes = [self._lane(i) for i in lps]
        hp_lanes = [self._lane(i) for i in hps]
        allowance = self._shed_allowance(now)
        decided = plan(waiting, lanes, hp_lanes if self.rescue else [], now,
                       bound_tokens / lp_rate, self.shed, allowance,
                       protected, shares,
                       now - self.last_saturated < SATURATION_MEMORY,
                       self._hp_whole_share(hps, hp_rate), favoured_first=self.by_slo,
                       per_lp=self.per_lp)
        if decided.saturated:
            self.last_saturated = now
        self._drops.extend(now for _ in decided.shed)
        return decided, by_id

    def lp_prompt_rate(self, lps: list[int], measured: float) -> float:
        """Prompt tokens per second an LP is taken to prefill a waiting request's own prompt
        at: the LPs' `measured` rate (chunks beside their decodes), or one whole step at
        their model's prefill-alone rate `WHOLE_PREFILL_SLOWDOWN` times slower, whichever
        is faster -- an LP runs a prompt whole when only that meets its TTFT
        (`tbt_budget.whole_prefill_pays`), so a long prompt that chunks would make late is
        not late on that account. The work ahead of it stays at the measured rate."""
        if not lps:
            return measured
        return max(measured, self._whole_step_rate(lps, WHOLE_PREFILL_SLOWDOWN))

    def _hp_whole_share(self, hps: list[int], measured: float) -> float:
        """The HPs' measured rate over their whole-step rate (`HP_WHOLE_PREFILL_SLOWDOWN`):
        the share of its measured-rate price a rescue takes when the HP runs the prompt
        whole. `plan` takes no share above 1 (a whole step is never the slower way)."""
        if not hps:
            return 1.0
        return measured / self._whole_step_rate(hps, HP_WHOLE_PREFILL_SLOWDOWN)

    def _whole_step_rate(self, instance_ids: list[int], slowdown: float) -> float:
        """Prompt tokens per second of one whole step: the instances' mean prefill-alone
        rate, `slowdown` times slower."""
        return sum(self.backlogs[i].model_rate for i in instance_ids) / len(instance_ids) / slowdown

    def _lane(self, instance_id: int) -> Lane:
        backlog = self.backlogs[instance_id]
        return Lane(instance_id, self.seconds(instance_id, backlog.tokens),
                    self.seconds(instance_id, backlog.sheddable_tokens))

    def _shares(self) -> TenantShares | None:
        """The tenants' counters once there is more than one tenant to share among."""
        return self.tenants if self.tenants is not None and self.tenants.counting else None

    def _shed_allowance(self, now: float) -> int | None:
        for times in (self._arrivals, self._drops):
            while times and times[0] < now - MISS_WINDOW:
                times.popleft()
        return miss_allowance(self.miss_budget, len(self._arrivals), len(self._drops))


def _priced_per_instance(t: Tracked, tokens: int, lps: list[int], hps: list[int],
                         lp_rate: float, hp_rate: float, klass: int, favoured: bool,
                         ) -> Waiting:
    """A request with a prefix cached somewhere: its seconds on each instance (what it
    would still compute there), the cheapest LP's and HP's as its plain costs."""
    cost_on = tuple((i, (tokens - t.cached_on.get(i, 0)) / rate)
                    for ids, rate in ((lps, lp_rate), (hps, hp_rate)) for i in ids)
    lp_costs = [c for i, c in cost_on if i in lps] or [tokens / lp_rate]
    hp_costs = [c for i, c in cost_on if i in hps] or [tokens / hp_rate]
    return Waiting(t.request_id, t.arrival_time, t.submit.deadline, min(lp_costs),
                   min(hp_costs), t.submit.priority, cost_on, klass, t.tenant, tokens,
                   favoured)
