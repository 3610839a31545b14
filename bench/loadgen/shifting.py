"""The `shifting` workload: traffic whose character changes, phase after phase -- what an
`<n>A` layout (roles chosen online, docs/design.md §5.10) is for.

Its phases, in order and then again from the first until the run has its requests:

1. `poisson`    -- one SLO class (the run's targets), exponential gaps;
2. `mixed-slo`  -- Poisson with SLO classes drawn in the spec's `slo_mix` (default
   SHIFT_MIX: a large interactive share);
3. `bursty-cv4` -- one SLO class, gamma gaps of CV 4.

Each lasts its `phase_seconds` (default 60 s each; flag `--phase-seconds`), all at the
run's rate; the trace, length scale and prompt cap are the spec's. `phase_of` says which
phase an arrival time falls in, and `per_phase` the goodput of each phase's requests. The
requests themselves are built with the other workloads' (bench/loadgen/workloads.py
`shifting_requests`), which import the phases from here.
"""
from __future__ import annotations

from bench.records.schema import PhaseResult, RequestRecord
from bench.records.results import is_good

#: The workloads of the phases, in order.
PHASES = ("poisson", "mixed-slo", "bursty-cv4")
DEFAULT_PHASE_SECONDS = (60.0, 60.0, 60.0)


def phase_of(phase_seconds: tuple[float, ...], arrival: float) -> int:
    """The index (into PHASES) of the phase an arrival time falls in."""
    seconds = phase_seconds or DEFAULT_PHASE_SECONDS
    arrival %= sum(seconds)
    for i, length in enumerate(seconds):
        if arrival < length:
            return i
        arrival -= length
    return len(seconds) - 1


def per_phase(records: list[RequestRecord], phase_seconds: tuple[float, ...], ttft_slo: float,
              tbt_slo: float) -> list[PhaseResult]:
    """Goodput of each phase's requests (every repetition of a phase together)."""
    groups: dict[int, list[RequestRecord]] = {}
    for r in records:
        groups.setdefault(phase_of(phase_seconds, r.arrival), []).append(r)
    rows = []
    for i in sorted(groups):
        members = groups[i]
        good = sum(1 for r in members if is_good(r, ttft_slo, tbt_slo))
        rows.append(PhaseResult(phase=f"{i + 1}: {PHASES[i]}", num_requests=len(members),
                                good=good, goodput_pct=round(100.0 * good / len(members), 2)))
    return rows
