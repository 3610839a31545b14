"""The class floor over SLO classes (`class_floor_by = "slo"`): the same triage as
policies/class_floor.py's, with classes that are the requests' TTFT targets instead of
prompt-length quartiles.

On a workload of SLO classes (mixed-slo: interactive, standard, batch) the class that
falls under a fair floor is the one with the tightest target, whatever its prompt lengths
(docs/tensor_parallel.md: the 70B at tp 4 serves the interactive class worst, at every
prompt length over 2k). Protecting it protects the requests of that target: while the
interactive class's recent record is under the floor plus the margin, the triage sets
aside and drops requests of other targets first (standard and batch work), and its
requests are *favoured* as a tenant under its fair share is (policies/global_queue.py):
served first on their instance, so the plan counts only favoured work ahead of them, not
the LPs' backlogs of standard and batch prefills whose far deadlines leave them room, and
they are bound at once rather than held at the controller until an LP's backlog falls
under the binding bound (`plan(favoured_first=True)`). Each step mattered on the 70B
(docs/tensor_parallel.md): protection alone moved nothing (an interactive prompt misses
behind work already bound to its LP, which the triage cannot set aside); favoured in the
plan but bound late, short interactive prompts still waited ~0.9 s at the controller.

A request's class is its TTFT target in milliseconds (its deadline less its arrival),
numbered in the order the targets are first seen; requests that name none share the
server's default. Records, margin, minimum record and the bursts rule are
class_floor.py's. Deterministic and clock-free.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from policies.class_floor import OUTCOME_WINDOW, record_outcome, under_floor


def target_key(ttft_target: float) -> int:
    """A TTFT target as its class's key: whole milliseconds (float noise apart)."""
    return round(ttft_target * 1000)


@dataclass
class SloClasses:
    """The TTFT targets seen, and each one's recent TTFT record."""
    floor: float = 0.0
    index: dict[int, int] = field(default_factory=dict)    # target key -> class
    outcomes: list[deque] = field(default_factory=list)
    met: list[int] = field(default_factory=list)
    #: Arrivals come in bursts (the core's role switching says so): protect no class.
    in_bursts: bool = False

    @property
    def active(self) -> bool:
        return self.floor > 0

    def arrived(self, key: int) -> None:
        self.of(key)

    def of(self, key: int) -> int:
        """The class of a request of TTFT target `key` (a new one gets the next number)."""
        if key not in self.index:
            self.index[key] = len(self.outcomes)
            self.outcomes.append(deque(maxlen=OUTCOME_WINDOW))
            self.met.append(0)
        return self.index[key]

    def answered(self, key: int, met: bool) -> None:
        """A request got its first answer: a token (`met`: within its TTFT target), or a drop."""
        record_outcome(self.outcomes, self.met, self.of(key), met)

    def protected(self) -> frozenset[int]:
        """Classes whose recent met share is under the floor plus MARGIN."""
        if not self.active or self.in_bursts:
            return frozenset()
        return under_floor(self.outcomes, self.met, self.floor)
