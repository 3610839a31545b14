"""Which instances of an `<n>A` layout serve as LP and which as HP, decided online
(docs/design.md §5.10). Pure: what the controller observed over a window, and `now`, in;
at most one role change out.

The ruler's evidence (docs/results.md "Capacity on the ruler"): in capacity an HP pays
only when the traffic mixes SLO classes -- on uniform-SLO Poisson and bursty traffic
three LPs beat two LPs and an HP, on mixed SLO classes one LP and two HPs lead. An HP's
EDF order and its rescues serve the tight class a value-ordered LP would set aside; with
one class on steady traffic the HP is only a slower LP. In bursts it also serves the
longest prompts, which keeps every prompt-length class above its floor. So:

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
* **or, in bursts, a sixth of the instances** (rounded up: one at two to six, two at
  eight) -- unless the operator turns it off (`hps_in_bursts`): when the window's mean
  gap between arrivals is at least `burst_ratio` times its median gap -- most requests
  come close behind another, then a long pause. Under uniform SLOs an HP is a slower LP
  in capacity, but in a burst the LPs' value order sets the longest prompts aside all
  at once and an HP's EDF order serves them. Over 30 s, Poisson arrivals and a replayed
  conversation trace read under 2x, onoff under 5x, bursty-cv2 under 11x, bursty-cv4
  over 50x (1st and 99th percentiles). On bursty-cv4 one HP at three instances raised
  `3A`'s fair capacity by 38 % at 2 % of its capacity (4.5 % at the ruler's full run
  length), and on shifting by 3 % at none; two at three raised it more but cost 8-14 %
  of capacity; at eight, two HPs gave 15 % more fair capacity for 5 % of capacity, three
  18 % for 8 % (docs/fairness.md, "One HP in bursts"); with a class floor (the operator
  asks every prompt-length class to keep its share) half of them (`FAIR_BURST_HP_SHARE`:
  two at three), the prefill a burst's long prompts need -- shedding other classes for
  them does not make it (docs/fairness.md, "A class floor in bursts");
* **add** an HP (under the cap) when a meaningful share of arrivals was *late but
  rescuable*: set aside by the waiting room's Moore-Hodgson pass with an HP predicted able
  to finish it in time (rescued by one, or, where no HP could take it, one an idle HP
  would have finished);
* **remove** an HP -- the one that took least (rescues, LP offloads) -- when there are
  more than the cap allows, or when under `remove_share` of the arrivals were late but
  rescuable (rescued by the HPs or not): the HPs as a pool, not each one, must earn
  their place (a second HP that rescues little itself still keeps the first free to);
  not while the traffic is bursty: a quiet spell between bursts says nothing about the
  next one.

Hysteresis: a decision reads a window that began after the last change (`settle`), an
instance keeps a role at least `dwell` seconds, one change at a time (the caller sends
none while one is under way), never zero LPs, and one instance is always an LP.
"""
from __future__ import annotations

import math
import statistics
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
    burst_horizon: float = 30.0  # seconds of arrivals the burst test reads
    burst_ratio: float = 20.0   # mean gap >= this x the median gap: bursty traffic
    burst_hp_share: float = 1 / 6  # of the instances, rounded up, that may serve as HPs in bursts
    hps_in_bursts: bool = True  # whether bursts justify HPs (the controller's setting)


#: `burst_hp_share` under a class floor (the controller's `class_floor`).
FAIR_BURST_HP_SHARE = 1 / 2


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
    #: Mean over median gap between arrivals over the last `RoleParams.burst_horizon`
    #: seconds (0: too few arrivals to tell; inf: most came at the same instant).
    burstiness: float = 0.0


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


def burstiness(arrival_times: Sequence[float]) -> float:
    """Mean over median gap between consecutive `arrival_times` (sorted); 0 with fewer
    than two gaps. About 1.4 for Poisson arrivals."""
    gaps = [b - a for a, b in zip(arrival_times, arrival_times[1:])]
    if len(gaps) < 2:
        return 0.0
    middle = statistics.median(gaps)
    mean = sum(gaps) / len(gaps)
    return mean / middle if middle > 0 else (math.inf if mean > 0 else 0.0)


def in_bursts(window: Window, params: RoleParams) -> bool:
    """Whether the window's arrivals come in bursts, as far as the roles care."""
    return params.hps_in_bursts and window.burstiness >= params.burst_ratio


def hp_cap(num_instances: int, tight_share: float, params: RoleParams,
           bursty: bool = False) -> int:
    """The most HPs the window justifies (never every instance): the tight class's
    proportional share of the instances, rounded (halves down), plus one; in bursts at
    least `burst_hp_share` of them, rounded up."""
    if num_instances < 2:
        return 0
    burst = math.ceil(num_instances * params.burst_hp_share) if bursty else 0
    tight = (math.ceil(num_instances * tight_share - 0.5) + 1
             if tight_share >= params.tight_share else 0)
    return min(num_instances - 1, max(burst, tight))


def _why_fewer(tight: float, cap: int, bursty: bool, params: RoleParams) -> str:
    """Why the window justifies fewer HPs than serve."""
    if bursty:
        return f"arrivals come in bursts, {tight:.0%} have a tight TTFT SLO: {cap} HP(s) pay"
    if cap:
        return f"{tight:.0%} of arrivals have a tight TTFT SLO: {cap} HP(s) pay"
    steady = " and they do not come in bursts" if params.hps_in_bursts else ""
    return f"only {tight:.0%} of arrivals have a tight TTFT SLO{steady}: no HP pays"


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
    bursty = in_bursts(window, params)
    cap = hp_cap(len(seats), tight, params, bursty)
    free_hps = sorted((s for s in free if s.role == HP),
                      key=lambda s: (s.rescued, s.backlog, s.instance_id))
    free_lps = sorted((s for s in free if s.role == LP), key=lambda s: (s.backlog, s.instance_id))
    if len(hps) > cap and free_hps:
        return RoleChange(free_hps[0].instance_id, LP, _why_fewer(tight, cap, bursty, params))
    if len(hps) < cap and len(lps) > 1 and free_lps and rescuable >= params.add_share:
        why = (f"arrivals come in bursts, mean gap {window.burstiness:.0f}x the median"
               if bursty else f"{tight:.0%} have a tight TTFT SLO")
        return RoleChange(free_lps[0].instance_id, HP,
                          f"{rescuable:.0%} of arrivals were late but rescuable, "
                          f"{why} (up to {cap} HP(s))")
    if free_hps and rescuable < params.remove_share and not bursty:
        return RoleChange(free_hps[0].instance_id, LP,
                          f"only {window.rescuable} of {window.arrivals} arrivals in "
                          f"{window.seconds:g} s needed a rescue")
    return None
