"""Fairness-aware shedding: no class of requests pays for everyone else's goodput
(docs/design.md §5.8).

The waiting room's triage (policies/global_queue.py) maximises the number of requests
that meet their deadlines, so under load it sets aside, and sheds, the costliest: the
longest prompts. That is the best count, and a user with long documents sees a third of
them refused. With a class floor F (`class_floor`, a share), a class whose recent
requests met their TTFT target less often than F plus a margin is *protected*: the
triage sets aside the costliest request of an unprotected class instead (shedding
elsewhere: several short prompts may go for one long one), and plans each request on
the LP that frees up first rather than on the pooled LPs, so that a long prompt one LP
can still start in time is kept (policies/global_queue.py). A protected request that is
late anyway is still dropped: demoting it instead was tried and only delayed everyone
(docs/fairness.md).

While arrivals come in bursts (an `<n>A` layout's burst test, policies/roles.py) no class
is protected: there the floor takes HPs instead (half the instances), whose deadline
order serves a burst's long prompts, since shedding the other classes for them takes
overall goodput under its target first (docs/fairness.md, "A class floor in bursts").

Classes are prompt-length quartiles of the recent arrivals (`PromptClasses`, the same
split the capacity ruler reports). Each class's record is its last `OUTCOME_WINDOW`
requests that got a first answer: a first token within its TTFT target or not, or a drop.
Deterministic and clock-free: the core tells it what arrived and what was answered.
"""
from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

#: Prompt lengths kept to estimate the quartiles, and how often they are recomputed (at
#: every arrival until that many have come).
LENGTH_WINDOW = 2048
REFRESH_EVERY = 256
#: First answers per class that make up its recent record.
OUTCOME_WINDOW = 200
#: A class is protected while its met share is under the floor plus this margin (act
#: before it falls under), and only once it has this many answers on record.
MARGIN = 0.05
MIN_OUTCOMES = 20
NUM_CLASSES = 4


def quartile_bounds(lengths: list[int]) -> tuple[int, ...]:
    """The three quartile boundaries of `lengths` (class k: bounds[k-1] <= len < bounds[k])."""
    ordered = sorted(lengths)
    n = len(ordered)
    return tuple(ordered[min(n - 1, (n * q) // NUM_CLASSES)] for q in range(1, NUM_CLASSES))


@dataclass
class PromptClasses:
    """Quartiles of the recent prompt lengths, and each class's recent TTFT record."""
    floor: float = 0.0
    lengths: deque = field(default_factory=lambda: deque(maxlen=LENGTH_WINDOW))
    bounds: tuple[int, ...] = ()
    outcomes: list = field(default_factory=lambda: [deque(maxlen=OUTCOME_WINDOW)
                                                    for _ in range(NUM_CLASSES)])
    met: list = field(default_factory=lambda: [0] * NUM_CLASSES)  # sum of each record
    _since_refresh: int = 0
    #: Arrivals come in bursts (the core's role switching says so): protect no class.
    in_bursts: bool = False

    @property
    def active(self) -> bool:
        return self.floor > 0

    def arrived(self, prompt_len: int) -> None:
        self.lengths.append(prompt_len)
        self._since_refresh += 1
        if self._since_refresh >= REFRESH_EVERY or len(self.lengths) < REFRESH_EVERY:
            self.bounds = quartile_bounds(list(self.lengths))
            self._since_refresh = 0

    def of(self, prompt_len: int) -> int:
        return bisect.bisect_right(self.bounds, prompt_len)

    def answered(self, prompt_len: int, met: bool) -> None:
        """A request got its first answer: a token (`met`: within its TTFT target), or a drop."""
        record_outcome(self.outcomes, self.met, self.of(prompt_len), met)

    def protected(self) -> frozenset[int]:
        """Classes whose recent met share is under the floor plus MARGIN."""
        if not self.active or self.in_bursts:
            return frozenset()
        return under_floor(self.outcomes, self.met, self.floor)


def record_outcome(outcomes: list[deque], met_counts: list[int], k: int, met: bool) -> None:
    """Class `k`'s record takes one first answer (`met`: within its TTFT target), its
    oldest leaving a full window; `met_counts[k]` stays the record's sum."""
    record = outcomes[k]
    if len(record) == record.maxlen:
        met_counts[k] -= record[0]
    record.append(met)
    met_counts[k] += met


def under_floor(outcomes: list[deque], met_counts: list[int], floor: float) -> frozenset[int]:
    """The classes with a record long enough whose met share is under `floor` + MARGIN."""
    return frozenset(k for k, record in enumerate(outcomes)
                     if len(record) >= MIN_OUTCOMES
                     and met_counts[k] < (floor + MARGIN) * len(record))
