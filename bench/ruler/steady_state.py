"""Which requests a run measures, and whether its goodput held: the steady-state rule.

A finite run starts empty and ends draining, so its first and last requests see a
lighter load than the rest. The rule (`MeasureRule`, defaults below):

* **warm-up**: the first 10 % of requests by arrival are not measured;
* **cool-down**: nor are the last 10 % (after the last arrival the queue only drains, and
  a reordering scheduler would serve the tail with no competition);
* the measured middle is cut into 4 windows by arrival; a point **holds** its target
  when the measured goodput reaches it *and* every window is within 3 points of it --
  a queue that grows slowly through the run shows up as a failing last window even
  when the mean still passes.

`requests_for(measured)` says how many requests to simulate for that many measured ones
(4,500 measured -> 5,625 simulated).

A workload may put priming requests before its run (`warmup` requests: the earlier turns
of the conversations a multi-turn run joins, filling the prefix cache). They arrive first
and are never measured; the shares above apply to the requests after them.

With request classes (bench/records/request_classes.py) the verdict also gives each class's goodput
over the measured requests, and `fair_holds`: the point holds and every class reaches
the fair floor.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

from bench.records.schema import RequestRecord
from bench.records.results import is_good
from bench.records.request_classes import (
    ClassGoodput, RequestClasses, class_goodput, holds_floor, token_goodput_pct,
)


class MeasureRule(msgspec.Struct, frozen=True, kw_only=True):
    warmup: float = 0.10        # share of requests (by arrival) left out at the start
    cooldown: float = 0.10      # ... and at the end
    windows: int = 4            # windows of the measured requests for the stability check
    window_slack: float = 3.0   # points a window may fall below the target

    def requests_for(self, measured: int) -> int:
        """Requests to run so that `measured` of them are measured."""
        return math.ceil(measured / (1.0 - self.warmup - self.cooldown))

    def span(self, num_requests: int, primed: int = 0) -> tuple[int, int]:
        """[start, stop): the positions, in arrival order, of the measured requests of a
        run whose first `primed` requests are priming ones."""
        run = num_requests - primed
        return (primed + math.floor(run * self.warmup),
                num_requests - math.floor(run * self.cooldown))

    def measured(self, records: Sequence[RequestRecord]) -> list[RequestRecord]:
        """The middle of the run, in arrival order."""
        ordered = sorted(records, key=lambda r: (r.arrival, r.index))
        start, stop = self.span(len(ordered), sum(r.warmup for r in ordered))
        return ordered[start:stop]


class Verdict(msgspec.Struct, frozen=True):
    """Goodput of the measured requests, overall and per window (in arrival order), %."""
    goodput_pct: float
    window_goodput_pct: list[float]
    holds: bool
    num_measured: int
    #: Per class (none without classes), and whether it holds with every class at the floor.
    classes: list[ClassGoodput] = []
    fair_holds: bool = False
    token_goodput_pct: float = 0.0


def judge(records: Sequence[RequestRecord], target: float, ttft_slo: float, tbt_slo: float,
          rule: MeasureRule = MeasureRule(), classes: RequestClasses | None = None,
          fair_floor: float = 0.0) -> Verdict:
    """Does this run hold `target` % goodput in steady state (see the module docstring),
    and with every class of `classes` at `fair_floor` (a share) too?"""
    measured = rule.measured(records)
    good = [is_good(r, ttft_slo, tbt_slo) for r in measured]
    if not good:
        return Verdict(0.0, [], False, 0)
    overall = 100.0 * sum(good) / len(good)
    size = math.ceil(len(good) / rule.windows)
    windows = [100.0 * sum(chunk) / len(chunk)
               for chunk in (good[i:i + size] for i in range(0, len(good), size))]
    holds = overall >= target and min(windows) >= target - rule.window_slack
    per_class = class_goodput(measured, classes, ttft_slo, tbt_slo) if classes else []
    return Verdict(overall, windows, holds, len(good), per_class,
                   holds and holds_floor(per_class, fair_floor),
                   token_goodput_pct(measured, ttft_slo, tbt_slo))


def misses_allowed(num_requests: int, target: float, rule: MeasureRule = MeasureRule(),
                   primed: int = 0) -> int:
    """Measured misses beyond which a run of `num_requests` (`primed` of them priming)
    cannot hold `target` any more (a simulator may stop it early then: the point fails
    whatever comes next)."""
    start, stop = rule.span(num_requests, primed)
    return math.floor((stop - start) * (100.0 - target) / 100.0 + 1e-9)
