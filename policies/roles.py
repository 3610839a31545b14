"""Which instances of an `<n>A` layout serve as LP and which as HP, decided online
(docs/design.md §5.10). Pure: what the controller observed over a window, and `now`, in;
at most one role change out.

The ruler's evidence (docs/results.md "Capacity on the ruler"): an HP pays only when the traffic
mixes SLO classes -- on uniform-SLO Poisson and bursty traffic three LPs beat two LPs and
an HP, on mixed SLO classes one LP and two HPs lead. An HP's EDF order and its rescues
serve the tight class a value-ordered LP would set aside; with one class the HP is only
a slower LP. So:

* **how many HPs may pay** (`hp_cap`): none unless a meaningful share of the window's
  arrivals has a *tight* TTFT SLO (at most `tight_ratio` of the window's upper quartile:
  a class stays tight when it is most of the traffic, up to three quarters of it, as in
  a burst of interactive chat beside some standard and batch work -- measured against the
  median such a majority would be its own reference and nothing would be tight);
  then the tight share of the instances, rounded (halves down), plus one (so a rescue
  finds an HP free), never all of them -- at three instances one HP up to a sixth tight,
  else two (1L2H led mixed-slo at 30 %); at eight and 31 % tight three, where 6L2H leads
  in capacity and 4L4H in fair capacity (twice the share, the first rule, gave five or
  six there and lost capacity);
* **add** an HP (under the cap) when a meaningful share of arrivals was *late but
  rescuable*: set aside by the waiting room's Moore-Hodgson pass with an HP predicted able
  to finish it in time (rescued by one, or, where no HP could take it, one an idle HP
  would have finished);
* **remove** an HP -- the one that took least (rescues, LP offloads) -- when there are
  more than the cap allows, or when under `remove_share` of the arrivals were late but
  rescuable (rescued by the HPs or not): the HPs as a pool, not each one, must earn
  their place (a second HP that rescues little itself still keeps the first free to).

Hysteresis: a decision reads a window that began after the last change (`settle`), an
instance keeps a role at least `dwell` seconds, one change at a time (the caller sends
none while one is under way), never zero LPs, and one instance is always an LP.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

LP, HP = "lp", "hp"


@dataclass(frozen=True)
class RoleParams:
    window: float = 10.0        # seconds of evidence a decision reads
    dwell: float = 20.0         # least seconds an instance keeps a role
    min_arrivals: int = 20      # fewer in the window: no decision
    tight_ratio: float = 0.5    # TTFT SLO <= this x the window's upper quartile: tight
    tight_share: float = 0.05   # least share of tight arrivals for any HP
    add_share: float = 0.02     # late-but-rescuable share of arrivals that adds an HP
    remove_share: float = 0.005  # fewer late-but-rescuable arrivals: an HP goes back to LP


@dataclass(frozen=True)
class Seat:
    """One ready instance as the policy sees it."""
    instance_id: int
    role: str            # "lp" | "hp"
    since: float         # when it took this role (-inf: it started in it)
    backlog: float = 0.0  # its predicted prefill backlog, seconds
    rescued: int = 0     # requests it took as an HP in the window (rescues, offloads)


@dataclass(frozen=True)
class Window:
    """What the controller saw over the last `seconds` (at most `RoleParams.window`)."""
    seconds: float
    arrivals: int
    tight: int           # of them, with a tight TTFT SLO
    rescuable: int       # set aside late, an HP able to finish them in time


@dataclass(frozen=True)
class RoleChange:
    instance_id: int
    role: str
    reason: str


def tight_count(ttft_slos: Sequence[float], ratio: float) -> int:
    """How many of `ttft_slos` are at most `ratio` x their upper quartile."""
    if not ttft_slos:
        return 0
    ordered = sorted(ttft_slos)
    upper_quartile = ordered[3 * len(ordered) // 4]
    return sum(1 for s in ordered if s <= ratio * upper_quartile)


def hp_cap(num_instances: int, tight_share: float, params: RoleParams) -> int:
    """The most HPs the window's tight share justifies (never every instance): the tight
    class's proportional share of the instances, rounded (halves down), plus one."""
    if num_instances < 2 or tight_share < params.tight_share:
        return 0
    return min(num_instances - 1, math.ceil(num_instances * tight_share - 0.5) + 1)


def decide(seats: Sequence[Seat], window: Window, now: float, last_change: float,
           params: RoleParams = RoleParams()) -> RoleChange | None:
    """At most one role change, or None. `seats`: the ready instances no change is under
    way for; `last_change`: when the last one took effect (-inf: none yet)."""
    if len(seats) < 2 or window.seconds < params.window or window.arrivals < params.min_arrivals:
        return None
    if now - last_change < params.window:
        return None  # the window still holds traffic of the layout before
    free = [s for s in seats if now - s.since >= params.dwell]
    hps = [s for s in seats if s.role == HP]
    lps = [s for s in seats if s.role == LP]
    tight = window.tight / window.arrivals
    rescuable = window.rescuable / window.arrivals
    cap = hp_cap(len(seats), tight, params)
    free_hps = sorted((s for s in free if s.role == HP),
                      key=lambda s: (s.rescued, s.backlog, s.instance_id))
    free_lps = sorted((s for s in free if s.role == LP), key=lambda s: (s.backlog, s.instance_id))
    if len(hps) > cap and free_hps:
        why = (f"{tight:.0%} of arrivals have a tight TTFT SLO: {cap} HP(s) pay"
               if cap else f"only {tight:.0%} of arrivals have a tight TTFT SLO: no HP pays")
        return RoleChange(free_hps[0].instance_id, LP, why)
    if len(hps) < cap and len(lps) > 1 and free_lps and rescuable >= params.add_share:
        return RoleChange(free_lps[0].instance_id, HP,
                          f"{rescuable:.0%} of arrivals were late but rescuable, "
                          f"{tight:.0%} have a tight TTFT SLO (up to {cap} HP(s))")
    if free_hps and rescuable < params.remove_share:
        return RoleChange(free_hps[0].instance_id, LP,
                          f"only {window.rescuable} of {window.arrivals} arrivals in "
                          f"{window.seconds:g} s needed a rescue")
    return None
