"""One request's stream to its HTTP handler: the tokens (or the failure) the controller
passes on, in order.

The controller puts tokens in (`put`) or ends it with an error (`fail`); the handler
reads one at a time with `first()` / `tokens()`, or everything queued at once with
`take()` (waking on `ready`, an asyncio.Event the handles of one response may share:
`listen`), and calls `close(outcome)` when it is done for any reason. Only a request the
core has not settled yet -- the client left early, or stopped at a stop string -- is
then reported to the core as left (it aborts the request on its instance); a request
that ended (`settled`) is not. The request's state lives in the core (`daemon/core/request_state.py`); a
request that moves between instances keeps its stream, so the client's stream and its
detokenizer simply go on.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable

from daemon.core.events import Settle
from daemon.errors import ApiError
from daemon.core.request_state import Outcome
from ipc.messages import TokenOutput


class RequestHandle:
    def __init__(self, request_id: str,
                 on_close: Callable[["RequestHandle", Outcome], None]) -> None:
        self.request_id = request_id
        self.finished = False  # its last token or its error is in the queue
        self.closed = False
        #: Prompt tokens its instance found in the prefix cache (set as it ends).
        self.num_cached_tokens = 0
        #: The core's last word on it (where it went, how it ended), once it ended.
        self.settled: Settle | None = None
        #: Arrival to the start of its prefill, seconds: known at its first token.
        self.queue_delay: float | None = None
        self._items: deque[TokenOutput | ApiError] = deque()
        #: Set whenever an item is put; the reader clears it before it looks.
        self.ready = asyncio.Event()
        self._on_close = on_close

    # ---- controller side ---------------------------------------------------------------
    def put(self, output: TokenOutput) -> None:
        if not self.finished:
            self.finished = output.finish_reason is not None
            self._items.append(output)
            self.ready.set()

    def fail(self, error: ApiError) -> None:
        if not self.finished:
            self.finished = True
            self._items.append(error)
            self.ready.set()

    # ---- HTTP handler side -------------------------------------------------------------
    def listen(self, ready: asyncio.Event) -> None:
        """Wake `ready` (e.g. one event for every choice of a response) from now on."""
        self.ready = ready
        if self._items:
            ready.set()

    def take(self) -> deque[TokenOutput | ApiError]:
        """Everything queued now, in order (maybe nothing); never waits."""
        items, self._items = self._items, deque()
        return items

    async def first(self) -> TokenOutput:
        while not self._items:
            self.ready.clear()
            await self.ready.wait()
        item = self._items.popleft()
        if isinstance(item, ApiError):
            raise item
        return item

    async def tokens(self, first: TokenOutput | None = None) -> AsyncIterator[TokenOutput]:
        """Yields outputs until the one with a finish reason; raises ApiError on failure."""
        item = first if first is not None else await self.first()
        while True:
            yield item
            if item.finish_reason is not None:
                return
            item = await self.first()

    def close(self, outcome: Outcome | str = Outcome.CANCELLED) -> None:
        """The reader is done: `outcome` says why if the request had not ended
        (COMPLETED after a stop string, CANCELLED when the client left). Only then is the
        controller told (`on_close`): of a settled request the core has no more to do."""
        if not self.closed:
            self.closed = True
            if self.settled is None:
                self._on_close(self, Outcome(outcome))
