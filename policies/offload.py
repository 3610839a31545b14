"""Request offload (paper §5.3): which LP waiting requests should move to an HP instance.

Only a request whose prefill has not started may move (then only its prompt tokens
travel, never KV cache). For such a request, with `own` = its predicted prefill time
(what is left of its prompt, in token-budget chunks):

1. KEEP if LP will start it in time: `lp_start + own <= deadline`.
2. HOPELESS if even an idle HP cannot make it: `now + ipc_delay + own > deadline`.
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
"""
from __future__ import annotations

import enum
from collections.abc import Iterable

from policies.predictor import Predictor, remaining_prefill_time
from policies.request_view import WaitingRequest

#: From `ascendra reproduce threshold` (2L1H, ShareGPT, a100-llama3-8b): mean goodput over
#: 9 and 10 QPS and two seeds was 84.5 / 86.0 / 85.9 / 86.6 / 87.1 % at 0.5 / 1 / 1.5 / 2 / 3,
#: and 71.9 / 73.9 / 73.3 % at 1 / 2 / 3 over three seeds at 9.5 QPS (1,500 requests):
#: flat within seed noise from 1.5 up, worse below 1. 2.0 is the best of the second sweep.
DEFAULT_OFFLOAD_THRESHOLD = 2.0


class OffloadDecision(enum.Enum):
    KEEP = "keep"
    OFFLOAD = "offload"
    HOPELESS = "hopeless"


def _decide(deadline: float, now: float, own: float, lp_start: float, full_batch: float,
            threshold: float, ipc_delay: float) -> OffloadDecision:
    """The rule in the module docstring for one request not yet started (`own`: its
    predicted prefill; `lp_start`: when LP would start it, absolute)."""
    if lp_start + own <= deadline:
        return OffloadDecision.KEEP
    if now + ipc_delay + own > deadline:
        return OffloadDecision.HOPELESS
    slack = deadline - now - own
    worst_hp = full_batch + own + ipc_delay
    return OffloadDecision.OFFLOAD if slack < threshold * worst_hp else OffloadDecision.KEEP


def plan_offloads(waiting_ordered: Iterable[WaitingRequest], now: float, *, predictor: Predictor,
                  token_budget: int, next_batch_time: float,
                  threshold: float = DEFAULT_OFFLOAD_THRESHOLD,
                  ipc_delay: float = 0.0) -> tuple[list, list]:
    """(to offload, hopeless) among an LP's waiting queue, given in value order.

    LP is estimated to start the first waiting request after `next_batch_time`
    seconds (the predicted time of the batch it runs next, plus any prefill chunks
    already under way), and each later one after the predicted prefills of those
    ahead of it that stay on LP. Offloaded requests leave and delay no one; hopeless
    ones are counted as staying (drop them first, with `admission.should_drop`, when
    drops are on). A request whose prefill started always stays.
    """
    offload: list = []
    hopeless: list = []
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
        if decision is OffloadDecision.HOPELESS:
            hopeless.append(request)
        lp_start += own
    return offload, hopeless
