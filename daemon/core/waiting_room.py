"""The controller's waiting room, the structure late binding works on (docs/design.md
§5.6): requests no instance holds yet, and what the controller predicts of each
instance's prefill backlog. Sans-I/O; the core's late-binding component
(daemon/core/late_binding.py) owns one and applies what `plan` decides
(policies/global_queue.py).

Backlog of an instance, in prompt tokens = those it reported waiting after its last step
(`InstanceLoad`) + those of every Submit sent to it that it had not taken in then (the
load report counts the Submits it accepted). In seconds: tokens / its prefill rate --
the prompt tokens per second it measured while saturated, decodes sharing its steps
included -- or, before it has measured one, its performance model's rate for prefill
alone (the prefill curve it sent in Ready). A waiting request's own prefill on an LP is
priced at the faster of that rate and one whole step's (`WaitingRoom.lp_prompt_rate`).
"""
from __future__ import annotations

import bisect
import itertools
from collections import deque
from dataclasses import dataclass, field

from daemon.core.request_state import Tracked
from ipc.messages import InstanceLoad, Ready
from policies.class_floor import PromptClasses
from policies.global_queue import Lane, Plan, Shed, Waiting, miss_allowance, plan
from policies.perf.prefill_curve import curve_seconds
from policies.tenants import TenantShares

#: Requests planned per pass, earliest deadlines first (Moore-Hodgson's decisions for a
#: deadline-ordered prefix do not depend on what comes after it).
HORIZON = 512
#: The least share of its model's prefill-alone rate an instance is taken to run at.
MIN_RATE_SHARE = 0.25
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


@dataclass
class _Backlog:
    model_rate: float                   # tokens/s of prefill alone, from its curve
    measured_rate: float = 0.0          # tokens/s while saturated, from its reports
    reported: int = 0                   # prompt tokens waiting at its last report
    reported_sheddable: int = 0         # ... of sheddable requests (priority < 0)
    accepted: int = 0
    sent: int = 0
    #: (sequence number, prompt tokens, sheddable) of the Submits it has not taken in yet
    in_transit: deque = field(default_factory=deque)

    @property
    def rate(self) -> float:
        """The measured rate, but never under MIN_RATE_SHARE of prefill alone: a stall (no
        KV free for a while) must not make the instance look stopped for ever."""
        if not self.measured_rate:
            return self.model_rate
        return max(self.measured_rate, MIN_RATE_SHARE * self.model_rate)

    @property
    def tokens(self) -> int:
        return self.reported + sum(n for _, n, _ in self.in_transit)

    @property
    def sheddable_tokens(self) -> int:
        """Of `tokens`, those of sheddable requests (served after every other)."""
        return self.reported_sheddable + sum(n for _, n, shed in self.in_transit if shed)

    def add(self, tokens: int, sheddable: bool) -> None:
        self.in_transit.append((self.sent, tokens, sheddable))
        self.sent += 1

    def report(self, load: InstanceLoad) -> None:
        self.reported, self.accepted = load.queued_prefill_tokens, load.accepted
        self.reported_sheddable = load.queued_sheddable_tokens
        self.measured_rate = load.prefill_rate or self.measured_rate
        while self.in_transit and self.in_transit[0][0] < self.accepted:
            self.in_transit.popleft()


def model_rate(ready: Ready) -> float:
    """Prompt tokens per second of prefill alone, as the instance's curve predicts."""
    budget = ready.token_budget or 2048
    return budget / curve_seconds(ready.prefill_curve, budget)


class WaitingRoom:
    def __init__(self, shed: Shed, rescue: bool = True, miss_budget: float = 1.0,
                 prefix_aware: bool = False, class_floor: float = 0.0,
                 tenants: TenantShares | None = None) -> None:
        self.shed = Shed(shed)
        self.rescue = rescue
        #: Price each request per instance by the prompt tokens it would not find cached
        #: there (`Tracked.cached_on`), so binding prefers an LP holding its prefix.
        self.prefix_aware = prefix_aware
        self.miss_budget = miss_budget
        self._arrivals: deque[float] = deque()   # arrival times within MISS_WINDOW
        self._drops: deque[float] = deque()      # times of the plans' drops, likewise
        self._queue: list[tuple[tuple, Tracked]] = []   # sorted by their keys
        self._keys: dict[str, tuple] = {}
        self._seq = itertools.count()
        self.backlogs: dict[int, _Backlog] = {}
        #: Prompt-length classes and their recent TTFT record (docs/design.md §5.8).
        self.classes = PromptClasses(floor=class_floor)
        #: Tenants' counters, when service is shared by weight (docs/design.md §5.11).
        self.tenants = tenants
        self.last_saturated = -float("inf")   # the last plan that set aside a request not sheddable

    # ---- the queue ---------------------------------------------------------------------
    def add(self, tracked: Tracked, again: bool = False) -> None:
        """`again`: it waited here before (an instance changing role gave it back): its
        arrival is counted already."""
        submit = tracked.submit
        key = (-submit.priority, submit.deadline, tracked.arrival_time, next(self._seq))
        if not tracked.requeued and not again:
            self._arrivals.append(tracked.arrival_time)
            if self.classes.active:
                self.classes.arrived(len(tracked.original.prompt_token_ids))
            if self._shares_count(tracked):
                self.tenants.arrived(tracked.tenant)
        self._keys[tracked.request_id] = key
        bisect.insort(self._queue, (key, tracked), key=lambda item: item[0])

    def remove(self, tracked: Tracked) -> None:
        key = self._keys.pop(tracked.request_id, None)
        if key is not None:
            i = bisect.bisect_left(self._queue, key, key=lambda item: item[0])
            del self._queue[i]

    def answered(self, tracked: Tracked, met: bool) -> None:
        """A request got its first answer: its first token (`met`: by its deadline), or
        a drop. Its class's record (the class floor) counts it."""
        if self.classes.active:
            self.classes.answered(len(tracked.original.prompt_token_ids), met)

    def computed(self, tracked: Tracked, tokens: int) -> None:
        """`tokens` more were computed for it (what its tenant's fair share counts)."""
        if self._shares_count(tracked):
            self.tenants.computed(tracked.tenant, tokens)

    def ended(self, tracked: Tracked) -> None:
        """A request it took in (waiting here or since bound) has its terminal answer."""
        if self._shares_count(tracked):
            self.tenants.ended(tracked.tenant)

    def _shares_count(self, tracked: Tracked) -> bool:
        """Fair shares are kept among requests that are not sheddable: sheddable traffic
        (priority < 0) takes only what the rest leaves, so it claims no share -- else a
        tenant whose sheddable requests are shed would stand under its share and be
        served first, its requests jumping the queues of a higher band and the HPs held
        back for it."""
        return self.tenants is not None and tracked.submit.priority >= 0

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._keys

    def __len__(self) -> int:
        return len(self._queue)

    def waited_too_long(self, now: float, multiple: float) -> list[Tracked]:
        """Requests that have waited more than `multiple` times their TTFT SLO."""
        return [t for _, t in self._queue
                if now - t.arrival_time > multiple * (t.submit.ttft_slo or float("inf"))]

    # ---- backlogs ----------------------------------------------------------------------
    def ready(self, ready: Ready) -> None:
        self.backlogs[ready.instance_id] = _Backlog(model_rate(ready))

    def sent(self, instance_id: int, tokens: int, sheddable: bool = False) -> None:
        if instance_id in self.backlogs:
            self.backlogs[instance_id].add(tokens, sheddable)

    def reported(self, instance_id: int, load: InstanceLoad) -> None:
        if instance_id in self.backlogs:
            self.backlogs[instance_id].report(load)

    def forget(self, instance_id: int) -> None:
        self.backlogs.pop(instance_id, None)

    def backlog_tokens(self, instance_id: int) -> int:
        return self.backlogs[instance_id].tokens

    def seconds(self, instance_id: int, tokens: float) -> float:
        """Predicted seconds for `instance_id` to prefill `tokens` more prompt tokens."""
        return tokens / self.backlogs[instance_id].rate

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
        for _, t in head:
            tokens = len(t.submit.prompt_token_ids)
            klass = classes.of(len(t.original.prompt_token_ids)) if classes.active else 0
            if self.prefix_aware and t.cached_on:
                waiting.append(_priced_per_instance(t, tokens, lps, hps, prompt_rate, hp_rate,
                                                    klass, t.tenant in favoured))
                continue
            waiting.append(Waiting(t.request_id, t.arrival_time, t.submit.deadline,
                                   tokens / prompt_rate, tokens / hp_rate, t.submit.priority,
                                   klass=klass, tenant=t.tenant, tokens=tokens,
                                   favoured=t.tenant in favoured))
        lanes = [self._lane(i) for i in lps]
        hp_lanes = [self._lane(i) for i in hps]
        decided = plan(waiting, lanes, hp_lanes if self.rescue else [], now,
                       bound_tokens / lp_rate, self.shed, self._shed_allowance(now),
                       classes.protected(), shares,
                       now - self.last_saturated < SATURATION_MEMORY,
                       self._hp_whole_share(hps, hp_rate))
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
