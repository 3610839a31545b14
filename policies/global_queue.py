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
   the LP holding most of it while it would still finish it by its deadline there (its
   backlog plus its cost there), even one past the bound; if none would, the LP that
   would finish it first (`_prefix_home`). An HP takes it instead when it would compute
   less of it than any LP (a conversation it served before, as a rescue or on a ticket)
   and finish it sooner: without it every later turn of that conversation would go back
   to an LP that never saw its history. Rescue picks its HP alike. With `favoured_first`
   (a class floor over SLO classes, policies/slo_class_floor.py) favoured requests are
   bound first, past the bound: their instance serves them before its backlog.

With class floors (policies/class_floor.py) a request of a *protected* class is never
the one set aside in step 1 while a request of another class could be (the costliest of
those goes instead), and step 1 then places each request on the LP that frees up first
instead of on the pool (a queue of one band and tenant; with several, step 1 keeps to the
pool). So does step 1 with `per_lp` (the waiting room's, with ESP groups on: there the
LPs serve long prompts whole beside short ones, and the pool's mean backlog set aside
short requests that an idle LP could start at once; docs/elastic_sequence_parallelism.md,
"3A's short class").

Priority bands and tenants (docs/design.md §5.11). Requests of a higher band are planned
first; the request step 1 sets aside is one of the lowest band kept so far (sheddable
traffic, priority < 0, before anything else), and -- with fair shares (`shares`,
policies/tenants.py) -- of the tenant whose counter would stand highest were all its
kept requests served (the one furthest over its share), the costliest of those. Late
requests are demoted and dropped in the same order. A request of a tenant under its
share is *favoured*: the instance serves it before the rest of its band (so the plan
counts only favoured work ahead of it, not the LPs' backlogs), it is rescued first, and
the HPs keep room for such requests (HP_RESERVE). With one band and one tenant none of
this applies: the plan is the one above, decision for decision.

Pure: numbers in, decisions out.
"""
from __future__ import annotations

import heapq
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from policies.tenants import TenantShares


#: While some tenant is under its fair share, an HP rescues a request of another only if
#: it finishes it this share of its TTFT target before its deadline: the HP's queue stays
#: short enough for the under-served tenant's long prompts, which the LPs -- slowed by
#: the flooding tenant's decodes -- cannot prefill in time even first in line. Chosen on
#: the tenants study's flood (docs/tenants.md): 0.6 left the light tenant 90 %, 0.75 and
#: more keep it over 95 % at about 0.95 x the total goodput.
HP_RESERVE = 0.75


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
    tenant: str = ""     # who sent it (policies/tenants.py)
    tokens: int = 0      # prompt tokens it would compute (what fair shares count)
    #: Its tenant is under its share: the instance serves it before the rest of its band
    #: (Submit.favoured), so only favoured work is ahead of it there.
    favoured: bool = False

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
    #: Of `backlog`, the sheddable requests' (priority < 0): the instance serves every
    #: other request before them, so they are not ahead of one that is not sheddable.
    sheddable: float = 0.0

    def ahead_of(self, w: Waiting) -> float:
        """Seconds of its backlog that `w` would wait behind there."""
        return self.backlog if w.priority < 0 else self.backlog - self.sheddable

    def add(self, w: Waiting, seconds: float) -> None:
        self.backlog += seconds
        if w.priority < 0:
            self.sheddable += seconds


@dataclass
class Plan:
    #: bound now: to an LP, or to an HP holding more of its prefix than any LP
    to_lp: list[tuple[Waiting, int]] = field(default_factory=list)
    to_hp: list[tuple[Waiting, int]] = field(default_factory=list)   # rescued
    shed: list[Waiting] = field(default_factory=list)                # dropped now
    order: list[Waiting] = field(default_factory=list)               # what stays, in order
    #: A request that is not sheddable was late (no HP could rescue it) though an idle
    #: instance would have finished it in time: late for the load, not its own length.
    saturated: bool = False


def plan(queue: Sequence[Waiting], lps: Sequence[Lane], hps: Sequence[Lane], now: float,
         bound: float, shed: Shed = Shed.DEMOTE, shed_allowance: int | None = None,
         protected: frozenset[int] = frozenset(), shares: TenantShares | None = None,
         saturated: bool = False, hp_whole_share: float = 1.0,
         favoured_first: bool = False, per_lp: bool = False) -> Plan:
    """`shed_allowance`: the most requests this pass may drop (None: no limit);
    `protected`: the classes at risk of falling under their floor; `shares`: the
    tenants' counters, when service is shared by weight; `saturated`: requests that are
    not sheddable were set aside lately (`Plan.saturated` of the recent plans), and
    sheddable ones (priority < 0) are shed on sight (with shed = "drop");
    `hp_whole_share`: the share of a rescue's `hp_cost` an HP takes when it runs the
    prompt whole (under 1 when that is faster than its measured rate); `favoured_first`:
    a favoured request is bound past the LPs' backlog bound (`_bind`); `per_lp`: step 1
    places each request on the LP that frees up first, not on the pool (`_feasible`)."""
    out = Plan()
    if saturated and shed is Shed.DROP and any(w.priority < 0 for w in queue):
        out.shed = [w for w in queue if w.priority < 0]
        queue = [w for w in queue if w.priority >= 0]
    if not queue:
        return out
    hp_lanes = [Lane(h.instance_id, h.backlog, h.sheddable) for h in hps]  # rescues add to them
    if shed is Shed.KEEP or not lps:
        ordered, late = sorted(queue, key=_deadline_order), []
    else:
        if _one_group(queue, shares):
            ordered, late = _feasible(queue, lps, now, protected, per_lp)
        else:
            ordered, late = _feasible_by_group(queue, lps, now, protected, shares)
        late = _rescue(late, hp_lanes, now, out,
                       shares is not None and bool(shares.favoured()), hp_whole_share)
        out.saturated = any(w.priority >= 0 and now + min(w.cost, w.hp_cost) <= w.deadline
                            for w in late)  # late for the load, not for its own length
        if shed is Shed.DROP:
            dropped, late = _costliest(late, shed_allowance, shares)
            out.shed += dropped
        late.sort(key=_demoted_order(shares))
    _bind(ordered + late, list(lps), bound, out, hp_lanes, now, favoured_first)
    return out


def _one_group(queue: Sequence[Waiting], shares: TenantShares | None) -> bool:
    """Every request of one band, none favoured, and of one tenant when shares count."""
    first = queue[0]
    if any(w.priority != first.priority or w.favoured for w in queue):
        return False
    return shares is None or all(w.tenant == first.tenant for w in queue)


def _demoted_order(shares: TenantShares | None):
    """Late requests kept waiting: higher bands first, then the tenant least served so
    far, then the oldest (none starves)."""
    if shares is None:
        return lambda w: (-w.priority, w.arrival)
    counters = shares.counters
    return lambda w: (-w.priority, counters.get(w.tenant, 0.0), w.arrival)


def _deadline_order(w: Waiting) -> tuple:
    return (-w.priority, w.deadline, w.arrival)


def _feasible(queue: Sequence[Waiting], lps: Sequence[Lane], now: float,
              protected: frozenset[int] = frozenset(), per_lp: bool = False,
              ) -> tuple[list[Waiting], list[tuple[int, Waiting]]]:
    """(kept in deadline order, set aside with their places in deadline order) by
    Moore-Hodgson on the pooled LPs, the costliest request set aside -- or, while a class
    is protected or with `per_lp`, on each LP (`_feasible_per_lp`). The pool spreads the
    LPs' backlogs evenly, which is wrong where one LP holds a long prompt whole: a short
    request the other LPs could start now looks late behind a third of it."""
    if protected or per_lp:
        return _feasible_per_lp(queue, lps, now, protected)
    speed = len(lps)
    clock = now + sum(lane.ahead_of(queue[0]) for lane in lps) / speed  # one band
    kept: list[tuple[float, int, Waiting]] = []   # max-heap on cost
    aside: list[tuple[int, Waiting]] = []
    push, pop = heapq.heappush, heapq.heappop
    for i, w in enumerate(sorted(queue, key=_deadline_order)):
        start = clock  # when an LP of the pool frees up for it ...
        push(kept, (-w.cost, -i, w))  # ties: set the later one aside
        clock += w.cost / speed
        if start + w.cost > w.deadline:  # ... and then one LP prefills it alone
            _, minus_place, longest = pop(kept)
            clock -= longest.cost / speed
            aside.append((-minus_place, longest))
    return _in_deadline_order(kept), aside


def _feasible_per_lp(queue: Sequence[Waiting], lps: Sequence[Lane], now: float,
                     protected: frozenset[int],
                     ) -> tuple[list[Waiting], list[tuple[int, Waiting]]]:
    """`_feasible` with each request placed on the LP that frees up first (list
    scheduling: binding hands the head to the least loaded LP), a request set aside
    giving its time back to its LP, and the request set aside the costliest of an
    unprotected class while there is one. Used while a class is protected, and with
    `per_lp` (ESP groups on: long prompts served whole on one LP): the pool's
    mean backlog sets aside a long prompt that the least loaded LP could still start in
    time, and the longest prompts are the class that falls under its floor first
    (docs/fairness.md, "The class floor plans on each LP")."""
    clocks = [now + lane.ahead_of(queue[0]) for lane in lps]  # one band
    kept: list[tuple[float, int, Waiting]] = []   # max-heap on cost
    placed: list[int] = []                        # by deadline place: its LP's index
    aside: list[tuple[int, Waiting]] = []
    for i, w in enumerate(sorted(queue, key=_deadline_order)):
        soonest = min(range(len(clocks)), key=clocks.__getitem__)
        start = clocks[soonest]
        heapq.heappush(kept, (-w.cost, -i, w))  # ties: set the later one aside
        placed.append(soonest)
        clocks[soonest] += w.cost
        if start + w.cost > w.deadline:
            _, minus_place, victim = _pop_unprotected(kept, protected)
            clocks[placed[-minus_place]] -= victim.cost
            aside.append((-minus_place, victim))
    return _in_deadline_order(kept), aside


def _in_deadline_order(kept: list[tuple[float, int, Waiting]]) -> list[Waiting]:
    """The requests of a `(-cost, -place, request)` heap, by their places in deadline order."""
    return [w for _, _, w in sorted(kept, key=lambda entry: -entry[1])]


def _feasible_by_group(queue: Sequence[Waiting], lps: Sequence[Lane], now: float,
                       protected: frozenset[int], shares: TenantShares | None,
                       ) -> tuple[list[Waiting], list[tuple[int, Waiting]]]:
    """`_feasible` for a queue of several bands or tenants: the same pass in deadline
    order (favoured requests first in their band), a late request making room by
    setting others aside -- from the lowest band kept, of the tenant furthest over its
    share (`_victim_group`) -- until it fits or is set aside itself. The victim may be
    cheaper than the late request, so one may not be enough (Moore-Hodgson's one victim
    is the costliest, which always is); a request that cannot fit even first in line
    goes aside at once, taking no one with it.

    A favoured request jumps the LPs' queues: only the favoured work kept before it is
    ahead of it (`ahead`), not the LPs' backlogs; the others wait for both (a request
    that is not sheddable only for the LPs' backlogs of such requests)."""
    speed = len(lps)
    backlog_all = sum(lane.backlog for lane in lps) / speed
    backlog_firm = backlog_all - sum(lane.sheddable for lane in lps) / speed
    ahead = clock = 0.0     # seconds of kept work: favoured, and all
    groups: dict[tuple[int, bool, str], list] = {}   # (band, favoured, tenant) -> max-heap
    kept_tokens: dict[str, int] = {}
    aside: list[tuple[int, Waiting]] = []
    for i, w in enumerate(sorted(queue, key=_favoured_order)):
        backlog = backlog_all if w.priority < 0 else backlog_firm
        if now + (0.0 if w.favoured else backlog) + w.cost > w.deadline:
            aside.append((i, w))   # late even first in line
            continue
        heapq.heappush(groups.setdefault((w.priority, w.favoured, w.tenant), []),
                       (-w.cost, -i, w))
        kept_tokens[w.tenant] = kept_tokens.get(w.tenant, 0) + w.tokens
        start = now + (ahead if w.favoured else backlog + clock)
        clock += w.cost / speed
        ahead += w.cost / speed if w.favoured else 0.0
        while start + w.cost > w.deadline:
            group = groups[_victim_group(groups, kept_tokens, shares, w.favoured)]
            _, minus_place, victim = (heapq.heappop(group) if not protected
                                      else _pop_unprotected(group, protected))
            kept_tokens[victim.tenant] -= victim.tokens
            clock -= victim.cost / speed
            ahead -= victim.cost / speed if victim.favoured else 0.0
            aside.append((-minus_place, victim))
            if victim is w:
                break
            if victim.favoured or not w.favoured:
                start -= victim.cost / speed
    return _in_deadline_order([entry for group in groups.values() for entry in group]), aside


def _favoured_order(w: Waiting) -> tuple:
    return (-w.priority, not w.favoured, w.deadline, w.arrival)


def _victim_group(groups: dict[tuple[int, bool, str], list], kept_tokens: dict[str, int],
                  shares: TenantShares | None, favoured: bool) -> tuple[int, bool, str]:
    """The group to set a request aside from, for a late request (`favoured`: only
    favoured work delays it, so only a favoured victim helps): the lowest band with
    requests kept; in it, the tenant whose counter would be highest with its kept
    requests served (without shares, the one holding the costliest request)."""
    kept = [key for key, group in groups.items() if group and (key[1] or not favoured)]
    band = min(key[0] for key in kept)
    candidates = [key for key in kept if key[0] == band]
    if shares is None or len(candidates) == 1:
        return min(candidates, key=lambda key: groups[key][0][:2])
    return max(candidates, key=lambda key: (shares.projected(key[2], kept_tokens[key[2]]),
                                            -groups[key][0][0]))


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


def _costliest(late: list[Waiting], allowance: int | None, shares: TenantShares | None = None,
               ) -> tuple[list[Waiting], list[Waiting]]:
    """(dropped: the `allowance` late requests to shed first, demoted: the rest). First:
    the lowest band, then (with `shares`) the tenant most served, then the costliest."""
    if allowance is None or allowance >= len(late):
        return late, []
    if shares is None:
        order = sorted(late, key=lambda w: (w.priority, -w.cost, w.arrival))
    else:
        counters = shares.counters
        order = sorted(late, key=lambda w: (w.priority, -counters.get(w.tenant, 0.0),
                                            -w.cost, w.arrival))
    return order[:max(allowance, 0)], order[max(allowance, 0):]


def miss_allowance(budget: float, arrived: int, shed: int) -> int | None:
    """How many more requests may be shed now: `budget` of those that `arrived` in the
    window, less those already `shed` in it (None: a budget of 1, no limit)."""
    if budget >= 1.0:
        return None
    return max(int(budget * arrived) - shed, 0)


def _rescue(aside: list[tuple[int, Waiting]], lanes: list[Lane], now: float, out: Plan,
            reserved: bool = False, whole_share: float = 1.0) -> list[Waiting]:
    """Send to an HP (`lanes`, whose backlogs it adds to) each set-aside request it can
    still finish in time (favoured ones first, then in deadline order: `aside` holds
    each one's place in it); the rest are late. `reserved`: some tenant is under its
    share, and the HPs keep room for it (HP_RESERVE). `whole_share`: an HP runs a
    rescued prompt whole when only that meets its TTFT, so its price there is at most
    this share of the measured one (`plan`'s `hp_whole_share`)."""
    whole_share = min(1.0, whole_share)
    late = []
    for _, w in sorted(aside, key=_rescue_order):
        if w.cost_on and lanes:  # the HP that would finish it first (a prefix cached there)
            lane = min(lanes, key=lambda h: h.ahead_of(w) + w.seconds_on(h.instance_id, w.hp_cost))
        else:
            lane = min(lanes, key=lambda h: h.ahead_of(w)) if lanes else None
        cost = w.seconds_on(lane.instance_id, w.hp_cost) * whole_share if lane is not None else 0.0
        room = HP_RESERVE * (w.deadline - w.arrival) if reserved and not w.favoured else 0.0
        if lane is not None and now + lane.ahead_of(w) + cost <= w.deadline - room:
            lane.add(w, cost)
            out.to_hp.append((w, lane.instance_id))
        else:
            late.append(w)
    return late


_place = operator.itemgetter(0)


def _rescue_order(entry: tuple[int, Waiting]) -> tuple[bool, int]:
    """Favoured requests first (their tenants are under their shares), then by place."""
    return (not entry[1].favoured, entry[0])


def _bind(ordered: list[Waiting], lanes: list[Lane], bound: float, out: Plan,
          hp_lanes: list[Lane], now: float, favoured_first: bool = False) -> None:
    """Bind `ordered` from its head while an LP has under `bound` seconds ahead of the
    next one (a request that is not sheddable counts no sheddable work ahead of it).
    With `favoured_first` the favoured requests are bound first, whatever the LPs'
    backlogs (each where the least is ahead of it): their instance serves them before
    the rest, so waiting here for that backlog only makes them late."""
    lanes = [Lane(lane.instance_id, lane.backlog, lane.sheddable) for lane in lanes]
    if favoured_first and lanes:
        for w in ordered:
            if w.favoured:
                _bind_one(w, min(lanes, key=lambda l: (l.ahead_of(w), l.instance_id)),
                          lanes, out, hp_lanes, now)
        ordered = [w for w in ordered if not w.favoured]
    position = 0
    while position < len(ordered) and lanes:
        w = ordered[position]
        lane = min(lanes, key=lambda l: (l.ahead_of(w), l.instance_id))
        if lane.ahead_of(w) >= bound:
            break
        _bind_one(w, lane, lanes, out, hp_lanes, now)
        position += 1
    out.order = ordered[position:]


def _bind_one(w: Waiting, lane: Lane, lanes: list[Lane], out: Plan, hp_lanes: list[Lane],
              now: float) -> None:
    """`w` to `lane` -- or, when a prefix of it is cached somewhere, to its home there."""
    cost = w.cost
    if w.cost_on:
        lane = _prefix_home(w, lanes, now, hp_lanes)
        cost = w.seconds_on(lane.instance_id, w.cost)
    out.to_lp.append((w, lane.instance_id))
    lane.add(w, cost)


def _prefix_home(w: Waiting, lanes: list[Lane], now: float, hp_lanes: list[Lane]) -> Lane:
    """Where a request with a prefix cached somewhere goes: the LP holding most of its
    prompt among those that would still finish it by its deadline (ties: the one that
    would finish it first), else the LP that would finish it first -- or an HP holding
    more of it than any LP, when that HP would finish it sooner still.

    Why not always the one that finishes it first: on another LP its cached prefix is
    computed again -- the pool's time, paid by everyone behind it -- and the
    conversation's history is then split, so its next turn misses there too. On
    multi-turn traffic the finish-first rule let the LPs' cache hits fall from turn to
    turn as the load rose (docs/results.md, "Multi-turn: a conversation stays where its
    history is"). An HP stays a place for rescues: it takes such a request only when it
    would finish it first, as before."""
    def finish(lane: Lane) -> float:
        return lane.ahead_of(w) + w.seconds_on(lane.instance_id, w.cost)
    in_time = [lane for lane in lanes if now + finish(lane) <= w.deadline]
    if in_time:
        home = min(in_time, key=lambda lane: (w.seconds_on(lane.instance_id, w.cost),
                                              finish(lane), lane.instance_id))
    else:
        home = min(lanes, key=lambda lane: (finish(lane), lane.instance_id))
    hps = [h for h in hp_lanes if w.seconds_on(h.instance_id, w.hp_cost) < w.cost]
    hp = min(hps, key=lambda lane: (finish(lane), lane.instance_id), default=None)
    return hp if hp is not None and finish(hp) < finish(home) else home
