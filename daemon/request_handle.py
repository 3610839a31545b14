"""The controller's side of one request: a queue of tokens the HTTP handler reads.

The controller puts tokens (or a failure) in; the handler reads them with
`first()` / `tokens()` and calls `close()` when it is done for any reason --
which aborts the request on its instance if it had not finished.

A request may move between instances (an offload, or a takeover after its instance
died): the handle stays, so the client's stream and its detokenizer simply go on.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from daemon.errors import ApiError
from ipc.messages import Submit, TokenOutput


class RequestHandle:
    def __init__(self, request_id: str, arrival_time: float,
                 on_close: Callable[["RequestHandle", str], None]) -> None:
        self.request_id = request_id
        self.arrival_time = arrival_time
        #: The instance that holds it; None while it is between instances (being taken
        #: over after its instance died).
        self.instance: int | None = None
        self.submit: Submit | None = None  # as last sent to an instance
        self.offloaded = False
        self.token_ids: list[int] = []     # every token sent on to the client, in order
        self.queued_tokens = 0             # prompt tokens counted as waiting (0: not waiting)
        self.num_recoveries = 0            # times it was taken over from a dead instance
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.finished = False
        self.closed = False
        self._queue: asyncio.Queue[TokenOutput | ApiError] = asyncio.Queue()
        self._on_close = on_close

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids)

    # ---- controller side ---------------------------------------------------------------
    def put(self, output: TokenOutput, now: float) -> None:
        if self.finished:
            return
        self.token_ids.append(output.token_id)
        if self.first_token_time is None:
            self.first_token_time = now
        self.last_token_time = now
        self.finished = output.finish_reason is not None
        self._queue.put_nowait(output)

    def fail(self, error: ApiError) -> None:
        if not self.finished:
            self.finished = True
            self._queue.put_nowait(error)

    # ---- HTTP handler side -------------------------------------------------------------
    async def first(self) -> TokenOutput:
        item = await self._queue.get()
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

    def close(self, outcome: str = "cancelled") -> None:
        """The reader is done: `outcome` says why if the request had not finished
        ("completed" after a stop string, "cancelled" when the client left)."""
        if not self.closed:
            self.closed = True
            self._on_close(self, outcome)
