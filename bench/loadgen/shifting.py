"""The `shifting` workload: traffic whose character changes, phase after phase -- what an
`<n>A` layout (roles chosen online, docs/design.md §5.10) is for.

Its phases, in order and then again from the first until the run has its requests:

1. `poisson`    -- one SLO class (the run's targets), exponential gaps;
2. `mixed-slo`  -- Poisson with SLO classes drawn in the spec's `slo_mix` (default
   SHIFT_MIX: a large interactive share);
3. `bursty-cv4` -- one SLO class, gamma gaps of CV 4.

Each lasts its `phase_seconds` (default 60 s each; flag `--phase-seconds`), all at the
run's rate; the trace, length scale and prompt cap are the spec's. `phase_of` says which
phase an arrival time falls in, and `per_phase` the goodput of each phase's requests.
"""
from __future__ import annotations

import msgspec

from bench.records.schema import PhaseResult, RequestRecord
from bench.records.results import is_good
from bench.loadgen.workload import WorkloadRequest

#: The workloads of the phases, in order.
PHASES = ("poisson", "mixed-slo", "bursty-cv4")
DEFAULT_PHASE_SECONDS = (60.0, 60.0, 60.0)


def shifting_requests(spec, *, rate: float, num_requests: int | None, duration: float | None,
                      seed: int, max_model_len: int | None) -> list[WorkloadRequest]:
    """`num_requests` requests, or every arrival within `duration` seconds, phase after
    phase (see the module docstring)."""
    from bench.loadgen.workloads import build_requests, workload
    seconds = spec.phase_seconds or DEFAULT_PHASE_SECONDS
    shared = dict(trace=spec.trace, length_scale=spec.length_scale,
                  max_prompt_len=spec.max_prompt_len)
    phases = [workload(name, **shared, **({"slo_mix": spec.slo_mix} if name == "mixed-slo"
                                           and spec.slo_mix else {}))
              for name in PHASES]
    requests: list[WorkloadRequest] = []
    start, k = 0.0, 0
    while True:
        if duration is not None and start >= duration:
            break
        if num_requests is not None and len(requests) >= num_requests:
            break
        i = k % len(PHASES)
        length = seconds[i] if duration is None else min(seconds[i], duration - start)
        for r in build_requests(phases[i], rate=rate, duration=length, seed=seed * 1000 + k,
                                max_model_len=max_model_len):
            requests.append(msgspec.structs.replace(r, index=len(requests),
                                                    arrival=start + r.arrival))
        start, k = start + seconds[i], k + 1
    return requests[:num_requests] if num_requests is not None else requests


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
