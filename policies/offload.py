"""Request offload (docs/design.md §5.4): which LP waiting requests should move to an HP instance.

Only a request whose prefill has not started may move (then only its prompt tokens
travel, never KV cache). For such a request, with `own` = its predicted prefill time
(what is left of its prompt, in token-budget chunks):

1. KEEP if LP will start it in time: `lp_start + own <= deadline`.
2. UNREACHABLE if even an idle HP cannot make it: `now + ipc_delay + own > deadline`.
   It is a drop candidate, not an offload (moving it would only burden the HP).
3. OFFLOAD if its slack is under `threshold` × the worst-case HP latency:
       slack          = deadline − now − own
       worst-case HP  = full_batch_time(token_budget) + own + ipc_delay
   (the HP may have just started one full-token-budget batch; then this prefill).
4. Otherwise KEEP: LP is late on it, but there is time to wait and see.

`threshold` (default 2.0, from the sweep below) sets how early LP lets go. The HP can
still meet the deadline exactly while `slack >= worst_hp − own`, so at 1.0 a
request is offloaded with one own-prefill time of margin to spare; lower values
offload later (below `1 − own / worst_hp` too late to be safe), higher values
offload sooner and load the HP with requests LP might have served. All times come
from the performance model, so they follow the GPU and the model: no per-model
constants.

`plan_offloads` walks a queue of request views: the reference. The engine calls
`offload_candidates` and `offload_rows`, the same decisions over the queue's columns:
rules 2 and 3 do not depend on where LP would start a request, so one vector pass finds
the few that may go, and only the queue up to the last of those is walked, in plain
floats, to add up when LP would start each of them.
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Iterable

import numpy as np

from policies.predictor import Predictor, remaining_prefill_time
from policies.queue_columns import QueueColumns
from policies.request_view import WaitingRequest

#: From `ascendra reproduce threshold` (2L1H, ShareGPT, a100-llama3-8b): mean goodput over
#: 9 and 10 QPS and two seeds was 84.5 / 86.0 / 85.9 / 86.6 / 87.1 % at 0.5 / 1 / 1.5 / 2 / 3,
#: and 71.9 / 73.9 / 73.3 % at 1 / 2 / 3 over three seeds at 9.5 QPS (1,500 requests):
#: flat within seed noise from 1.5 up, worse below 1. 2.0 is the best of the second sweep.
DEFAULT_OFFLOAD_THRESHOLD = 2.0


class OffloadDecision(enum.Enum):
    KEEP = "keep"
    OFFLOAD = "offload"
    UNREACHABLE = "unreachable"


def _decide(deadline: float, now: float, own: float, lp_start: float, full_batch: float,
            threshold: float, ipc_delay: float) -> OffloadDecision:
    """The rule in the module docstring for one request not yet started (`own`: its
    predicted prefill; `lp_start`: when LP would start it, absolute)."""
    if lp_start + own <= deadline:
        return OffloadDecision.KEEP
    if now + ipc_delay + own > deadline:
        return OffloadDecision.UNREACHABLE
    slack = deadline - now - own
    worst_hp = full_batch + own + ipc_delay
    return OffloadDecision.OFFLOAD if slack < threshold * worst_hp else OffloadDecision.KEEP


def plan_offloads(waiting_ordered: Iterable[WaitingRequest], now: float, *, predictor: Predictor,
                  token_budget: int, next_batch_time: float,
                  threshold: float = DEFAULT_OFFLOAD_THRESHOLD,
                  ipc_delay: float = 0.0) -> tuple[list, list]:
    """(to offload, unreachable) among an LP's waiting queue, given in value order.

    LP is estimated to start the first waiting request after `next_batch_time`
    seconds (the predicted time of the batch it runs next, plus any prefill chunks
    already under way), and each later one after the predicted prefills of those
    ahead of it that stay on LP. Offloaded requests leave and delay no one; unreachable
    ones are counted as staying (drop them first, with `admission.should_drop`, when
    drops are on). A request whose prefill started always stays.
    """
    offload: list = []
    unreachable: list = []
    full_batch = predictor.full_batch_time(token_budget)
    lp_start = now + next_batch_time
    for request in waiting_ordered:
        own = remaining_prefill_time(request, predictor, token_budget)
        if request.prefill_started:
            lp_start += own
            continue
        decision = _decide(request.deadline, now, own, lp_start, full_batch, threshold, ipc_delay)
        if decision is OffloadDecision.OFFLOAD:
            offload.append(request)
            continue
        if decision is OffloadDecision.UNREACHABLE:
            unreachable.append(request)
        lp_start += own
    return offload, unreachable


def offload_candidates(queue: QueueColumns, order: np.ndarray, now: float, *, full_batch: float,
                       threshold: float, ipc_delay: float) -> np.ndarray:
    """Places in `order` (the queue's rows in value order) of the requests `plan_offloads`
    might offload: not started, not unreachable, and short of slack (rules 2 and 3, which
    do not depend on where LP would start them). The rest stay whatever LP's backlog."""
    own, deadline = queue.own, queue.deadline
    unreachable = now + ipc_delay + own > deadline
    slack = deadline - now - own
    worst_hp = full_batch + own + ipc_delay
    may_go = ~queue.started & ~unreachable & (slack < threshold * worst_hp)
    return np.flatnonzero(may_go[order])


def offload_rows(queue: QueueColumns, order: np.ndarray, candidates: np.ndarray, now: float, *,
                 next_batch_time: Callable[[], float], full_batch: float, threshold: float,
                 ipc_delay: float) -> list[int]:
    """The rows `plan_offloads` offloads, in its order, given `offload_candidates`.
    `next_batch_time()` is asked only if the answer needs it.

    Whether a candidate goes depends on when LP would start it, which depends on which
    candidates ahead of it went. Bounds settle most of them at once: LP starts a
    candidate no sooner than if all candidates ahead went (and its next batch took no
    time), and no later than if only those sure to go went (predicted times are >= 0 and
    float addition is monotone, so this holds to the last bit). One late at the sooner
    bound goes; one on time at the later bound stays. Only the stretch between the first
    and the last candidate left open is walked request by request, as `plan_offloads`
    walks it.
    """
    if not candidates.size:
        return []
    head = order[:candidates[-1] + 1]
    own, deadline = queue.own[head], queue.deadline[head]
    if own.min() < 0:  # no bounds: walk them all
        goes = np.zeros(candidates.size, dtype=bool)
        return head[_walk_open(own, deadline, candidates, goes, ~goes, now + next_batch_time(),
                               now, full_batch, threshold, ipc_delay)].tolist()
    own_c, deadline_c = own[candidates], deadline[candidates]

    def on_time(start: float, gone: np.ndarray) -> np.ndarray:
        return _lp_starts(start, _without(own, gone))[candidates] + own_c <= deadline_c

    goes = ~on_time(now, candidates)
    if goes.all():
        return head[candidates].tolist()
    start = now + next_batch_time()
    goes = ~on_time(start, candidates)
    open_ = ~(goes | on_time(start, candidates[goes]))
    places = candidates[goes].tolist()
    if open_.any():
        places = sorted(places + _walk_open(own, deadline, candidates, goes, open_, start, now,
                                            full_batch, threshold, ipc_delay))
    return head[places].tolist()


def _walk_open(own: np.ndarray, deadline: np.ndarray, candidates: np.ndarray, goes: np.ndarray,
               open_: np.ndarray, start: float, now: float, full_batch: float,
               threshold: float, ipc_delay: float) -> list[int]:
    """Places of the open candidates that go: LP's start time added up one request at a
    time, from the first open candidate (all before it settled) to the last."""
    open_places = candidates[open_]
    first, last = int(open_places[0]), int(open_places[-1])
    gone = candidates[goes]
    lp_start = float(_lp_starts(start, _without(own[:first + 1], gone[gone < first]))[-1])
    state = np.zeros(last + 1 - first, dtype=np.int8)  # 0 stays, 1 goes, 2 open
    sure = gone[(gone >= first) & (gone <= last)]
    state[sure - first] = 1
    state[open_places - first] = 2
    going: list[int] = []
    walked = zip(own[first:last + 1].tolist(), deadline[first:last + 1].tolist(), state.tolist())
    for place, (seconds, due, what) in enumerate(walked, start=first):
        if what == 1:
            continue
        if what == 2 and _decide(due, now, seconds, lp_start, full_batch, threshold,
                                 ipc_delay) is OffloadDecision.OFFLOAD:
            going.append(place)
            continue
        lp_start += seconds
    return going


def _lp_starts(start: float, own: np.ndarray) -> np.ndarray:
    """When LP would start each request along `own`: `start` plus all before it, added
    one at a time from the front (a cumulative sum is that same sequence of additions)."""
    return np.cumsum(np.concatenate(([start], own)))[:-1]


def _without(own: np.ndarray, places: np.ndarray) -> np.ndarray:
    """`own` with the requests at `places` gone: their times 0.0, which adds nothing."""
    if not places.size:
        return own
    kept = own.copy()
    kept[places] = 0.0
    return kept
