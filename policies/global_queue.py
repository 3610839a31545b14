"""The controller's waiting queue, decided purely: which waiting request goes where, when.

Requests wait at the controller, not at an instance (late binding): an LP takes more
work only when its predicted prefill backlog falls under a bound, so a burst is not
committed to one LP before anyone knows which LP frees up first. Each pass (`plan`)
looks at the whole queue at `now`:

1. **Feasible set, by Moore-Hodgson.** In deadline order, add each request's predicted
   prefill time to the LP pool's predicted backlog (the pool drains as one machine of
   `len(lanes)` times an LP's speed, but a request's own prefill runs on one LP: it
   finishes its own prefill time after the pool reaches it); when a request would finish
   after its deadline, set aside the most expensive request taken so far (it, or an
   earlier long one). On one machine this maximises the number of requests that meet
   their deadlines (Moore and Hodgson 1968); the kept ones, in deadline order, all meet
   theirs as predicted.
2. **Rescue.** Each set-aside request that an HP instance can still finish in time (its
   own predicted backlog plus this prefill, before the deadline) goes there at once.
3. **Shed.** The rest are *late*: with `shed` = "drop" they end now with a clear answer
   (they would only delay the others and miss anyway); "demote" keeps them behind every
   feasible request (oldest first, so none starves); "keep" leaves them in deadline order.
   An operator's miss budget caps the drops of one pass (`shed_allowance`): the late
   requests that cost the most are dropped first -- each is a miss wherever it runs, so
   the costliest one frees the most time for the others -- and the rest are demoted.
4. **Bind.** The queue in order (feasible by deadline, then demoted) is handed out: the
   LP with the smallest backlog takes the head while its backlog is under `bound` -- or,
   when a prefix of the head's prompt is cached on some instances (`Waiting.cost_on`),
   the LP that would finish it first (its backlog plus its cost there: prefix-aware
   routing balanced against queue length), even one past the bound, whose backlog then
   exceeds it by less than the prefix saves. An HP joins that choice for a request it
   would compute less of than any LP (a conversation it served before, as a rescue or on
   a ticket): without it every later turn of that conversation would go back to an LP
   that never saw its history. Rescue picks its HP alike.

With class floors (policies/class_floor.py) a request of a *protected* class is never
the one set aside in step 1 while a request of another class could be (the costliest of
those goes instead).

Requests of a higher priority class are planned first. Pure: numbers in, decisions out.
"""
from __future__ import annotations

import heapq
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum


class Shed(str, Enum):
    DROP = "drop"        # end late requests at once (503 ttft_slo_missed, Retry-After)
    DEMOTE = "demote"    # serve them after every request that can still make it
    KEEP = "keep"        # no triage: deadline order for all


@dataclass(frozen=True, slots=True)
class Waiting:
    """A request in the controller's queue, as the plan sees it."""
    key: str
    arrival: float
    deadline: float
    cost: float          # predicted seconds to prefill it on an LP (the cheapest one)
    hp_cost: float       # ... on an HP
    priority: int = 0
    #: (instance id, predicted seconds there) for every instance, when they differ (a
    #: prefix of its prompt is cached on some): binding and rescue then weigh each
    #: instance's backlog plus its own cost there. Empty: `cost`/`hp_cost` everywhere.
    cost_on: tuple[tuple[int, float], ...] = ()
    klass: int = 0       # its prompt-length class (policies/class_floor.py)

    def seconds_on(self, instance_id: int, default: float) -> float:
        for i, seconds in self.cost_on:
            if i == instance_id:
                return seconds
        return default


@dataclass(slots=True)
class Lane:
    """One instance's predicted prefill backlog, seconds from now."""
    instance_id: int
    backlog: float


@dataclass
class Plan:
    #: bound now: to an LP, or to an HP holding more of its prefix than any LP
    to_lp: list[tuple[Waiting, int]] = field(default_factory=list)
    to_hp: list[tuple[Waiting, int]] = field(default_factory=list)   # rescued
    shed: list[Waiting] = field(default_factory=list)                # dropped now
    order: list[Waiting] = field(default_factory=list)               # what stays, in order


def plan(queue: Sequence[Waiting], lps: Sequence[Lane], hps: Sequence[Lane], now: float,
         bound: float, shed: Shed = Shed.DEMOTE, shed_allowance: int | None = None,
         protected: frozenset[int] = frozenset()) -> Plan:
    """`shed_allowance`: the most requests this pass may drop (None: no limit);
    `protected`: the classes at risk of falling under their floor."""
    out = Plan()
    if not queue:
        return out
    hp_lanes = [Lane(h.instance_id, h.backlog) for h in hps]  # rescues add to them
    if shed is Shed.KEEP or not lps:
        ordered, late = sorted(queue, key=_deadline_order), []
    else:
        ordered, late = _feasible(queue, lps, now, protected)
        late = _rescue(late, hp_lanes, now, out)
        if shed is Shed.DROP:
            out.shed, late = _costliest(late, shed_allowance)
        late.sort(key=lambda w: (-w.priority, w.arrival))
    _bind(ordered + late, list(lps), bound, out, hp_lanes)
    return out


def _deadline_order(w: Waiting) -> tuple:
    return (-w.priority, w.deadline, w.arrival)


def _feasible(queue: Sequence[Waiting], lps: Sequence[Lane], now: float,
              protected: frozenset[int] = frozenset(),
              ) -> tuple[list[Waiting], list[tuple[int, Waiting]]]:
    """(kept in deadline order, set aside with their places in deadline order) by
    Moore-Hodgson on the pooled LPs; the request set aside is the costliest of an
    unprotected class while there is one."""
    speed = len(lps)
    clock = now + sum(lane.backlog for lane in lps) / speed
    kept: list[tuple[float, int, Waiting]] = []   # max-heap on cost
    aside: list[tuple[int, Waiting]] = []
    push, pop = heapq.heappush, heapq.heappop
    for i, w in enumerate(sorted(queue, key=_deadline_order)):
        start = clock  # when an LP of the pool frees up for it ...
        push(kept, (-w.cost, -i, w))  # ties: set the later one aside
        clock += w.cost / speed
        if start + w.cost > w.deadline:  # ... and then one LP prefills it alone
            _, minus_place, longest = (pop(kept) if not protected
                                       else _pop_unprotected(kept, protected))
            clock -= longest.cost / speed
            aside.append((-minus_place, longest))
    return [w for _, _, w in sorted(kept, key=lambda entry: -entry[1])], aside


def _pop_unprotected(kept: list, protected: frozenset[int]) -> tuple[float, int, Waiting]:
    """Pop the costliest entry of an unprotected class from the heap (the costliest of
    all when every one is protected); the others stay."""
    skipped = []
    entry = None
    while kept:
        candidate = heapq.heappop(kept)
        if candidate[2].klass not in protected:
            entry = candidate
            break
        skipped.append(candidate)
    if entry is None:
        entry = skipped.pop(0)  # the costliest: popped first
    for other in skipped:
        heapq.heappush(kept, other)
    return entry


def _costliest(late: list[Waiting], allowance: int | None,
               ) -> tuple[list[Waiting], list[Waiting]]:
    """(dropped: the `allowance` costliest late requests, demoted: the rest)."""
    if allowance is None or allowance >= len(late):
        return late, []
    by_cost = sorted(late, key=lambda w: (-w.cost, w.arrival))
    return by_cost[:max(allowance, 0)], by_cost[max(allowance, 0):]


def miss_allowance(budget: float, arrived: int, shed: int) -> int | None:
    """How many more requests may be shed now: `budget` of those that `arrived` in the
    window, less those already `shed` in it (None: a budget of 1, no limit)."""
    if budget >= 1.0:
        return None
    return max(int(budget * arrived) - shed, 0)


def _rescue(aside: list[tuple[int, Waiting]], lanes: list[Lane], now: float, out: Plan,
            ) -> list[Waiting]:
    """Send to an HP (`lanes`, whose backlogs it adds to) each set-aside request it can
    still finish in time (in deadline order: `aside` holds each one's place in it); the
    rest are late."""
    late = []
    for _, w in sorted(aside, key=_place):
        if w.cost_on and lanes:  # the HP that would finish it first (a prefix cached there)
            lane = min(lanes, key=lambda h: h.backlog + w.seconds_on(h.instance_id, w.hp_cost))
        else:
            lane = min(lanes, key=_backlog) if len(lanes) > 1 else (lanes[0] if lanes else None)
        cost = w.seconds_on(lane.instance_id, w.hp_cost) if lane is not None else 0.0
        if lane is not None and now + lane.backlog + cost <= w.deadline:
            lane.backlog += cost
            out.to_hp.append((w, lane.instance_id))
        else:
            late.append(w)
    return late


_place = operator.itemgetter(0)
_backlog = operator.attrgetter("backlog")


def _bind(ordered: list[Waiting], lanes: list[Lane], bound: float, out: Plan,
          hp_lanes: list[Lane]) -> None:
    lanes = [Lane(lane.instance_id, lane.backlog) for lane in lanes]
    position = 0
    while position < len(ordered) and lanes:
        lane = min(lanes, key=lambda l: (l.backlog, l.instance_id))
        if lane.backlog >= bound:
            break
        w = ordered[position]
        cost = w.cost
        if w.cost_on:  # the instance that would finish it first, holding its prefix or not
            homes = lanes + [h for h in hp_lanes if w.seconds_on(h.instance_id, w.hp_cost) < w.cost]
            lane = min(homes, key=lambda l: (
                l.backlog + w.seconds_on(l.instance_id, w.cost), l.instance_id))
            cost = w.seconds_on(lane.instance_id, w.cost)
        out.to_lp.append((w, lane.instance_id))
        lane.backlog += cost
        position += 1
    out.order = ordered[position:]
