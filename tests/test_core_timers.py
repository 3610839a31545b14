"""The core's timers on the event loop: a timer reaches the core at its time or after,
never before -- a loop whose callback comes early (uvloop counts whole milliseconds) is
waited out, so a queue TTL that expires ends its request (issue #59's lost 503).

Covers: daemon/core_timers.py, daemon/controller.py.
"""
from __future__ import annotations

import asyncio
import time

import uvloop

from daemon.core.events import Timer, TimerFired
from daemon.core_timers import CoreTimers


class EarlyLoop:
    """A loop that only records what it is asked to call; the test runs each call when
    it likes, at the clock it sets."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, object, tuple]] = []

    def call_later(self, delay, callback, *args):
        self.calls.append((delay, callback, args))
        return self

    def cancel(self) -> None:   # the handle call_later returns
        pass


def test_a_callback_before_the_timers_time_arms_again_and_the_core_hears_it_only_when_due():
    clock = [1.0]
    fired: list[TimerFired] = []
    timers, loop = CoreTimers(lambda: clock[0], fired.append), EarlyLoop()
    timers.start(Timer("ttl", 1), 1.2, loop)
    [(delay, callback, args)] = loop.calls
    assert abs(delay - 0.2) < 1e-9
    clock[0] = 1.1995              # the loop's millisecond clock ran ahead of ours
    callback(*args)
    assert not fired               # the core would end nothing, and never hear of it again
    delay, callback, args = loop.calls[-1]
    assert abs(delay - 0.0005) < 1e-9
    clock[0] = 1.2
    callback(*args)
    assert fired == [TimerFired(1.2, Timer("ttl", 1))]


def test_on_uvloop_every_timer_reaches_the_core_at_or_after_its_time():
    """The daemon's loop: timers at sub-millisecond offsets, about a third of which a bare
    `call_later` runs before their time on uvloop."""
    async def run() -> list[tuple[float, float]]:
        loop = asyncio.get_running_loop()
        asked: dict[Timer, float] = {}
        got: list[tuple[float, float]] = []
        done = asyncio.Event()

        def fired(event: TimerFired) -> None:
            got.append((event.now, asked[event.timer]))
            if len(got) == len(asked):
                done.set()

        timers = CoreTimers(time.monotonic, fired)
        for key in range(60):
            at = time.monotonic() + 0.01 + key * 0.00037
            asked[Timer("ttl", key)] = at
            timers.start(Timer("ttl", key), at, loop)
        await asyncio.wait_for(done.wait(), 30)
        return got

    got = uvloop.run(run())
    assert len(got) == 60
    early = [at - now for now, at in got if now < at]
    assert not early, f"{len(early)} of 60 timers reached the core before their time"
