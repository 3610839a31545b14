"""The simulator's clock: a heap of (time, handler) events and the virtual now.

One box's simulation (bench/sim/simulator.py) owns one; a fleet (bench/sim/fleet.py) hands the
same one to every box, so B boxes and the gateway in front of them share one clock.
Events at the same time run in the order they were scheduled.
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable


class EventHeap:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list = []
        self._seq = itertools.count()

    def at(self, time: float, handler: Callable, *args) -> None:
        """Call `handler(*args)` when the clock reaches `time`."""
        heapq.heappush(self._heap, (time, next(self._seq), handler, args))

    def __bool__(self) -> bool:
        return bool(self._heap)

    def run_next(self) -> None:
        """Advance the clock to the earliest event and run it."""
        self.now, _, handler, args = heapq.heappop(self._heap)
        handler(*args)
