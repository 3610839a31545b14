"""The controller core's timers on the event loop (its `StartTimer` actions), each told
to the core as a `TimerFired` never before its time.

The loop alone does not promise that: uvloop (libuv) counts time in whole milliseconds,
so a `call_later` callback may run up to about a millisecond before the `time.monotonic()`
it was meant for. A core ends only what is due at the `now` it is given (a queue TTL,
daemon/core/queue_ttl.py, a recovery's give-up time), so a timer told early ended nothing
and was gone: a request past its TTL then waited its whole turn and was answered 200
(issue #59). A callback that comes early arms again for the rest of the wait.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from daemon.core.events import Timer, TimerFired


class CoreTimers:
    def __init__(self, clock: Callable[[], float], fired: Callable[[TimerFired], None]) -> None:
        """`clock`: the core's clock (the driver's); `fired`: where a due timer goes."""
        self.clock = clock
        self.fired = fired
        self._handles: dict[Timer, asyncio.TimerHandle] = {}

    def start(self, timer: Timer, at: float, loop: asyncio.AbstractEventLoop) -> None:
        """Tell `fired` of `timer` at `at` (the clock's time) or soon after, never before."""
        self._handles[timer] = loop.call_later(max(0.0, at - self.clock()),
                                               self._due, timer, at, loop)

    def _due(self, timer: Timer, at: float, loop: asyncio.AbstractEventLoop) -> None:
        now = self.clock()
        if now < at:   # the loop's millisecond clock ran ahead of ours
            self.start(timer, at, loop)
            return
        self._handles.pop(timer, None)
        self.fired(TimerFired(now, timer))

    def cancel_all(self) -> None:
        for handle in self._handles.values():
            handle.cancel()
        self._handles.clear()
