"""A live machine's speed over a run, for replaying it in the simulator.

On a machine whose speed wanders within a run (this project's 2-core VM ran the same
batches 0.81-1.16x as fast from one two-second stretch to the next:
docs/measured_profiles.md, 2026-11-29, third), a simulation at one speed queues less
than the live run near capacity: a slow stretch builds a queue a fast one does not take
back at once, so the tail of TTFT grows with the spread, not the mean. `SpeedTrace`
holds the live run's speed window by window -- its executor's seconds over a profile's
fit for the same steps (bench/profiling/step_log_study.py `speed-trace`) -- and
`simulate --speed-trace FILE` multiplies each step's time by the factor of the window
the step starts in (window 0 from the simulation's time 0, the live run's first step;
after the last window, the last factor; an ESP group's steps keep their own time). A diagnostic: it takes the live run's seconds
as given, to ask whether the rest of the simulation reproduces the run.
"""
from __future__ import annotations

from pathlib import Path

import msgspec


class SpeedTrace(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How slow the machine ran each `window_s` of a run against a profile (1: as the
    profile says; 1.1: 10 % slower)."""

    window_s: float
    factors: list[float]

    def at(self, now: float) -> float:
        """The factor of the window holding simulated time `now`."""
        return self.factors[min(max(0, int(now // self.window_s)), len(self.factors) - 1)]


def write_speed_trace(path: str | Path, trace: SpeedTrace) -> None:
    Path(path).write_bytes(msgspec.json.encode(trace) + b"\n")


def read_speed_trace(path: str | Path) -> SpeedTrace:
    """The trace in `path`; ValueError naming the file and the fault."""
    try:
        trace = msgspec.json.decode(Path(path).read_bytes(), type=SpeedTrace)
    except OSError as exc:
        raise ValueError(f"speed trace {str(path)!r}: {exc.strerror or exc}") from None
    except msgspec.DecodeError as exc:
        raise ValueError(f"speed trace {str(path)!r} is malformed: {exc}") from None
    if not trace.window_s > 0 or not trace.factors or min(trace.factors) <= 0:
        raise ValueError(f"speed trace {str(path)!r} needs window_s > 0 and factors, "
                         f"each > 0")
    return trace
