"""Value functions (paper §5.2): which waiting prefill is most urgent.

A value function maps (request, now, predictor, token_budget) to a sort key:
smaller runs sooner. `order_by_value` sorts a waiting queue by a request's priority
class first (higher class first: premium before free), then by the key, then by
arrival. EDF is the default: its key is the *latest start time* -- the deadline minus
the predicted time to prefill what is left of the prompt, run in token-budget chunks
-- so a long prompt starts before a short one with the same deadline.

Cost: one predictor question per waiting request per call. Wrap a costly model in
`predictor.MemoPredictor` (owned by the caller) so repeated calls hit a cache.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from policies.admission import ttft_lost
from policies.predictor import Predictor, remaining_prefill_time


class Waiting(Protocol):
    """The part of a waiting request the value functions read."""

    @property
    def arrival_time(self) -> float: ...
    @property
    def deadline(self) -> float: ...
    @property
    def priority(self) -> int: ...
    @property
    def num_computed_tokens(self) -> int: ...
    @property
    def num_uncomputed_tokens(self) -> int: ...
    @property
    def prefill_started(self) -> bool: ...


ValueFunction = Callable[[Waiting, float, Predictor, "int | None"], float]


def fcfs(request: Waiting, now: float, predictor: Predictor, token_budget: int | None) -> float:
    """First come, first served."""
    return request.arrival_time


def edf(request: Waiting, now: float, predictor: Predictor, token_budget: int | None) -> float:
    """Earliest latest-start time: deadline − predicted prefill time of the rest of the prompt."""
    return request.deadline - remaining_prefill_time(request, predictor, token_budget)


def sjf(request: Waiting, now: float, predictor: Predictor, token_budget: int | None) -> float:
    """Shortest predicted prefill first."""
    return remaining_prefill_time(request, predictor, token_budget)


def ljf(request: Waiting, now: float, predictor: Predictor, token_budget: int | None) -> float:
    """Longest predicted prefill first."""
    return -remaining_prefill_time(request, predictor, token_budget)


VALUE_FUNCTIONS: dict[str, ValueFunction] = {"edf": edf, "sjf": sjf, "ljf": ljf, "fcfs": fcfs}
DEFAULT_VALUE_FUNCTION = "edf"


def get_value_function(name: str) -> ValueFunction:
    try:
        return VALUE_FUNCTIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown value function {name!r}; choose one of {sorted(VALUE_FUNCTIONS)}") from None


def order_by_value(waiting: Iterable[Waiting], now: float, value_fn: ValueFunction,
                   predictor: Predictor, token_budget: int | None,
                   demote_lost: bool = False) -> list:
    """`waiting` most urgent first: higher priority class, then smaller value, then earlier arrival.

    With `demote_lost`, requests whose TTFT target is already lost (`admission.ttft_lost`)
    go behind all the others, in the same order among themselves. Goodput counts requests
    that meet their targets; a lost one is a miss whenever it runs, so running it first
    only makes the ones behind it late too (under EDF the most overdue request is the most
    "urgent", which turns a short overload into a cascade). Requests equal on every key
    keep their queue order (the sort is stable).
    """
    def key(request: Waiting) -> tuple[bool, int, float, float]:
        lost = demote_lost and ttft_lost(request, now, predictor, token_budget)
        return (lost, -request.priority, value_fn(request, now, predictor, token_budget),
                request.arrival_time)

    return sorted(waiting, key=key)


def waiting_order(value_fn: ValueFunction | str, predictor: Predictor,
                  token_budget: int | None) -> Callable[[Sequence[Waiting], float], list]:
    """A `(waiting, now) -> ordered list` callable, the shape a scheduler mode plugs in."""
    fn = get_value_function(value_fn) if isinstance(value_fn, str) else value_fn

    def order(waiting: Sequence[Waiting], now: float) -> list:
        return order_by_value(waiting, now, fn, predictor, token_budget)

    return order
