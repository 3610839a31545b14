"""Value functions (docs/design.md §5.2): which waiting prefill is most urgent.

A value function maps (request, now, predictor, token_budget) to a sort key:
smaller runs sooner. `order_by_value` sorts a waiting queue by a request's priority
class first (higher class first: premium before free), then by the key, then by
arrival. EDF's key is the *latest start time* -- the deadline minus the predicted time
to prefill what is left of the prompt, run in token-budget chunks -- so a long prompt
starts before a short one with the same deadline. `slack` is the default: on the
capacity ruler it ties or beats EDF on every workload measured (docs/figures/values.json:
+9 % on bursty CV 4), ties SJF within the search's resolution, and unlike SJF it cannot
starve a long prompt (aging).

Cost: `order_by_value` asks the predictor about each waiting request and sorts in
Python: the reference, for a few requests. The engine orders its whole queue every step
with `value_order`, the same order over the queue's columns (`queue_columns`) in one
numpy sort; each value function has a vector twin in `VALUE_KEYS` that computes the
same key with the same floating-point operations.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from policies.admission import ttft_unreachable
from policies.predictor import Predictor, remaining_prefill_time
from policies.queue_columns import QueueColumns, ttft_lost_rows
from policies.request_view import WaitingRequest


ValueFunction = Callable[[WaitingRequest, float, Predictor, "int | None"], float]
#: A value function's vector twin: (columns, now) -> the key of every request.
ValueKeys = Callable[[QueueColumns, float], np.ndarray]


def fcfs(request: WaitingRequest, now: float, predictor: Predictor, token_budget: int | None) -> float:
    """First come, first served."""
    return request.arrival_time


def edf(request: WaitingRequest, now: float, predictor: Predictor, token_budget: int | None) -> float:
    """Earliest latest-start time: deadline − predicted prefill time of the rest of the prompt."""
    return request.deadline - remaining_prefill_time(request, predictor, token_budget)


def sjf(request: WaitingRequest, now: float, predictor: Predictor, token_budget: int | None) -> float:
    """Shortest predicted prefill first."""
    return remaining_prefill_time(request, predictor, token_budget)


#: Seconds of key a request gains per second it has waited (`slack`): no request starves.
AGING = 0.1


def slack(request: WaitingRequest, now: float, predictor: Predictor, token_budget: int | None) -> float:
    """Shortest job first while the deadline allows, then least slack, with aging.

    The key is min(p, L) − AGING × waited, where p is the predicted prefill time of the
    rest of the prompt and L = deadline − now − p the time it can still wait. With
    plenty of slack a request ranks by its cost (SJF: short prompts first, the most
    requests served per second); as its slack runs out L falls under p and it rises
    ahead of the longer jobs that could still wait; the aging term lifts a request that
    has waited long (a demoted one, or a long prompt behind a stream of short ones)
    above newer ones, so none waits for ever.
    """
    cost = remaining_prefill_time(request, predictor, token_budget)
    can_wait = request.deadline - now - cost
    return min(cost, can_wait) - AGING * (now - request.arrival_time)


def ljf(request: WaitingRequest, now: float, predictor: Predictor, token_budget: int | None) -> float:
    """Longest predicted prefill first."""
    return -remaining_prefill_time(request, predictor, token_budget)


VALUE_FUNCTIONS: dict[str, ValueFunction] = {"edf": edf, "sjf": sjf, "ljf": ljf, "fcfs": fcfs,
                                              "slack": slack}
DEFAULT_VALUE_FUNCTION = "slack"

#: Each value function's key over a whole queue: the same arithmetic, array by array.
VALUE_KEYS: dict[str, ValueKeys] = {
    "edf": lambda q, now: q.deadline - q.own,
    "sjf": lambda q, now: q.own,
    "ljf": lambda q, now: -q.own,
    "fcfs": lambda q, now: q.arrival,
    "slack": lambda q, now: np.minimum(q.own, q.deadline - now - q.own) - AGING * (now - q.arrival),
}


def get_value_function(name: str) -> ValueFunction:
    try:
        return VALUE_FUNCTIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown value function {name!r}; choose one of {sorted(VALUE_FUNCTIONS)}") from None


def get_value_keys(name: str) -> ValueKeys:
    """The vector twin of `get_value_function(name)`."""
    get_value_function(name)
    return VALUE_KEYS[name]


def order_by_value(waiting: Iterable[WaitingRequest], now: float, value_fn: ValueFunction,
                   predictor: Predictor, token_budget: int | None,
                   demote_unreachable: bool = False) -> list:
    """`waiting` most urgent first: higher priority class, then smaller value, then earlier arrival.

    With `demote_unreachable`, requests whose TTFT target is already lost (`admission.ttft_unreachable`)
    go behind all the others, in the same order among themselves. Goodput counts requests
    that meet their targets; a lost one is a miss whenever it runs, so running it first
    only makes the ones behind it late too (under EDF the most overdue request is the most
    "urgent", which turns a short overload into a cascade). Requests equal on every key
    keep their queue order (the sort is stable).
    """
    def key(request: WaitingRequest) -> tuple[bool, int, float, float]:
        lost = demote_unreachable and ttft_unreachable(request, now, predictor, token_budget)
        return (lost, -request.priority, value_fn(request, now, predictor, token_budget),
                request.arrival_time)

    return sorted(waiting, key=key)


def value_order(queue: QueueColumns, now: float, value_keys: ValueKeys,
                demote_unreachable: bool = False, near: np.ndarray | None = None) -> np.ndarray:
    """The rows of `queue` most urgent first: `order_by_value`'s order (lost ones last when
    `demote_unreachable`, then by priority class, value, arrival and place in the queue).

    One sort by value; arrival and place decide only among equal values, so only those
    runs are sorted again. Lost requests and lower classes then move back, each group
    keeping its order. `near`: every row, in an order close to the answer (the last
    step's: keys move little between steps). It changes nothing but the time: sorting
    it is a stable merge of a few runs instead of a full sort, and the answer is one
    total order (place in the queue breaks every tie), whichever way it is reached."""
    if not len(queue):
        return np.arange(0)
    value = value_keys(queue, now)
    if near is None:
        order = np.argsort(value, kind="stable")
    else:
        order = near[np.argsort(value[near], kind="stable")]
    ranked = value[order]
    tied = ranked[1:] == ranked[:-1]
    if tied.any():
        order = _break_ties(order, tied, queue)
    group = _urgency_group(queue, now, demote_unreachable)
    if group is not None:
        order = _by_group(order, group)
    return order


def _by_group(order: np.ndarray, group: np.ndarray) -> np.ndarray:
    """`order` stably sorted by `group` (a bool, or small integers >= 0, per row)."""
    if group.dtype == bool:  # two groups: no sort needed
        later = group[order]
        return np.concatenate((order[~later], order[later]))
    if group.max() <= np.iinfo(np.int8).max:
        group = group.astype(np.int8)  # a stable sort of small integers is a radix sort
    return order[np.argsort(group[order], kind="stable")]


def _break_ties(order: np.ndarray, tied: np.ndarray, queue: QueueColumns) -> np.ndarray:
    """`order` (sorted by value) with each run of equal values sorted by arrival, then by
    place in the queue. `tied[i]`: places i and i + 1 hold equal values."""
    in_run = np.zeros(order.size, dtype=bool)
    in_run[1:] = tied
    in_run[:-1] |= tied
    places = np.flatnonzero(in_run)
    run = np.concatenate(([0], np.cumsum(~tied)))[places]  # a new run after each break
    rows = order[places]
    resorted = np.lexsort((queue.position[rows], queue.arrival[rows], run))
    order = order.copy()
    order[places] = rows[resorted]
    return order


def _urgency_group(queue: QueueColumns, now: float, demote_unreachable: bool) -> np.ndarray | None:
    """Per row, what ranks before value: lost (when demoted), then priority class, higher
    first, as one small integer (smaller first), or as a bool (lost) when all are of one
    class; None when it is the same for all."""
    priority = queue.priority
    top = priority.max()
    classes = top - priority if priority.min() != top else None
    group = classes
    if demote_unreachable:
        lost = ttft_lost_rows(queue, now)
        if lost.any():
            group = lost if classes is None else lost * (int(classes.max()) + 1) + classes
    return group
