"""Value functions (paper §5.2): which waiting prefill is most urgent.

A value function maps (request, now, predictor, token_budget) to a sort key:
smaller runs sooner. `order_by_value` sorts a waiting queue by a request's priority
class first (higher class first: premium before free), then by the key, then by
arrival. EDF's key is the *latest start time* -- the deadline minus the predicted time
to prefill what is left of the prompt, run in token-budget chunks -- so a long prompt
starts before a short one with the same deadline. `slack` is the default: on the
capacity ruler it ties or beats EDF on every workload measured (docs/figures/values.json:
+9 % on bursty CV 4), ties SJF within the search's resolution, and unlike SJF it cannot
starve a long prompt (aging).

Cost: one predictor question per waiting request per call. Wrap a costly model in
`predictor.MemoPredictor` (owned by the caller) so repeated calls hit a cache.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from policies.admission import ttft_lost
from policies.predictor import Predictor, remaining_prefill_time
from policies.request_view import WaitingRequest


ValueFunction = Callable[[WaitingRequest, float, Predictor, "int | None"], float]


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
    """Shortest job first while the deadline allows, then least laxity, with aging.

    The key is min(p, L) − AGING × waited, where p is the predicted prefill time of the
    rest of the prompt and L = deadline − now − p the time it can still wait. With
    plenty of slack a request ranks by its cost (SJF: short prompts first, the most
    requests served per second); as its slack runs out L falls under p and it rises
    ahead of the longer jobs that could still wait; the aging term lifts a request that
    has waited long (a demoted one, or a long prompt behind a stream of short ones)
    above newer ones, so none waits for ever.
    """
    cost = remaining_prefill_time(request, predictor, token_budget)
    laxity = request.deadline - now - cost
    return min(cost, laxity) - AGING * (now - request.arrival_time)


def ljf(request: WaitingRequest, now: float, predictor: Predictor, token_budget: int | None) -> float:
    """Longest predicted prefill first."""
    return -remaining_prefill_time(request, predictor, token_budget)


VALUE_FUNCTIONS: dict[str, ValueFunction] = {"edf": edf, "sjf": sjf, "ljf": ljf, "fcfs": fcfs,
                                              "slack": slack}
DEFAULT_VALUE_FUNCTION = "slack"


def get_value_function(name: str) -> ValueFunction:
    try:
        return VALUE_FUNCTIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown value function {name!r}; choose one of {sorted(VALUE_FUNCTIONS)}") from None


def order_by_value(waiting: Iterable[WaitingRequest], now: float, value_fn: ValueFunction,
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
    def key(request: WaitingRequest) -> tuple[bool, int, float, float]:
        lost = demote_lost and ttft_lost(request, now, predictor, token_budget)
        return (lost, -request.priority, value_fn(request, now, predictor, token_budget),
                request.arrival_time)

    return sorted(waiting, key=key)
