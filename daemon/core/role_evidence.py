"""What an `<n>A` layout's role policy reads (policies/roles.py, docs/design.md §5.10):
the controller's evidence over a sliding window -- arrivals and their TTFT SLOs (and,
over a longer horizon, their times: do they come in bursts?), the
requests the waiting room set aside late that an HP could finish in time, and which HP
took what (rescues, LP offloads). Sans-I/O: every call carries `now`.
"""
from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable

from policies.roles import Window, burstiness, tight_count


class RoleEvidence:
    def __init__(self, window: float, burst_horizon: float | None = None) -> None:
        """`burst_horizon`: seconds of arrival times the burst test reads (None: no burst
        test; the window's `burstiness` stays 0)."""
        self.window, self.burst_horizon = window, burst_horizon
        self.start: float | None = None                      # the first arrival
        #: (time, TTFT SLO), over the window or the burst horizon, whichever is longer.
        self._arrivals: deque[tuple[float, float]] = deque()
        self._rescuable: deque[float] = deque()              # times
        self._rescued: deque[tuple[float, int]] = deque()    # (time, HP)

    def arrived(self, now: float, ttft_slo: float) -> None:
        if self.start is None:
            self.start = now
        self._arrivals.append((now, ttft_slo))

    def set_aside(self, now: float, rescued_by: Iterable[int], rescuable_late: int) -> None:
        """A plan set requests aside: those HPs rescued one each, and `rescuable_late`
        more an idle HP would have finished in time."""
        for hp in rescued_by:
            self._rescued.append((now, hp))
            self._rescuable.append(now)
        self._rescuable.extend(now for _ in range(rescuable_late))

    def took(self, now: float, hp: int) -> None:
        """An HP took an LP's offload."""
        self._rescued.append((now, hp))

    def read(self, now: float, tight_ratio: float) -> tuple[Window, Counter]:
        """(the window up to `now`, requests each HP took in it)."""
        horizon = now - self.window
        kept = now - max(self.window, self.burst_horizon or 0.0)
        while self._arrivals and self._arrivals[0][0] < kept:
            self._arrivals.popleft()
        while self._rescued and self._rescued[0][0] < horizon:
            self._rescued.popleft()
        while self._rescuable and self._rescuable[0] < horizon:
            self._rescuable.popleft()
        seconds = 0.0 if self.start is None else min(now - self.start, self.window)
        slos = [slo for t, slo in self._arrivals if t >= horizon]
        bursts = (0.0 if self.burst_horizon is None else burstiness(
            [t for t, _ in self._arrivals if t >= now - self.burst_horizon]))
        window = Window(seconds, len(slos), tight_count(slos, tight_ratio), len(self._rescuable),
                        bursts)
        return window, Counter(hp for _, hp in self._rescued)
