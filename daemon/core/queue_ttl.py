"""Queue TTLs (llm-d's `x-llm-d-inference-ttl`, daemon/ttl_header.py): a request that
came with one and has still not started its prefill when it expires ends with
`ttl_expired` -- in the waiting room, or in an instance's queue, which is told to abort
it. A started request is past the queue and keeps running. Sans-I/O: one timer per
request with a TTL, each firing ends every request then past its TTL.
"""
from __future__ import annotations

import heapq
import itertools

from daemon.core.events import Action, Send, StartTimer, Timer
from daemon.core.ledger import Ledger
from daemon.core.request_state import Outcome, Tracked
from ipc.api_codes import EndCode
from ipc.messages import Abort

TTL = "ttl"


class QueueTtl:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        #: (expiry, request id) of the requests with a TTL, soonest first; an entry of a
        #: request that has ended or started is dropped when its time comes.
        self._expiries: list[tuple[float, str]] = []
        self._keys = itertools.count()

    def arrived(self, tracked: Tracked, ttl: float | None, out: list[Action]) -> None:
        """An accepted request with a TTL (seconds; None: none): its timer."""
        if ttl is None:
            return
        expiry = tracked.arrival_time + ttl
        heapq.heappush(self._expiries, (expiry, tracked.request_id))
        out.append(StartTimer(Timer(TTL, next(self._keys)), expiry))

    def end_expired(self, now: float, out: list[Action]) -> None:
        """The TTL timer: end every request past its TTL that has not started its
        prefill (503 `ttl_expired`, Retry-After as for any drop)."""
        ledger, expiries = self.ledger, self._expiries
        while expiries and expiries[0][0] <= now:
            expiry, request_id = heapq.heappop(expiries)
            tracked = ledger.requests.get(request_id)
            if tracked is None or tracked.prefill_start is not None \
                    or tracked.first_token_time is not None:
                continue
            holder = tracked.instance   # None: still in the waiting room
            ttl = expiry - tracked.arrival_time
            ledger.end(tracked, Outcome.DROPPED, EndCode.TTL_EXPIRED,
                       f"dropped: it waited {now - tracked.arrival_time:.3f} s, past its queue "
                       f"TTL of {ttl:.3f} s (x-llm-d-inference-ttl), without starting", out)
            if holder is not None:
                out.append(Send(holder, Abort(request_id=request_id)))
