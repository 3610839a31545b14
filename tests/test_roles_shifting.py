"""The `shifting` workload (bench/loadgen/shifting.py): phases of uniform-SLO Poisson,
mixed SLO classes and bursty arrivals, and goodput by phase.

Covers: bench/loadgen/shifting.py.
"""
from __future__ import annotations

import msgspec
import pytest

from bench.loadgen.shifting import PHASES, per_phase, phase_of
from bench.loadgen.workloads import build_requests, workload
from bench.records.schema import RequestRecord


def test_phases_follow_each_other_and_only_the_mixed_one_has_classes():
    spec = msgspec.structs.replace(workload("shifting"), phase_seconds=(10.0, 10.0, 10.0))
    requests = build_requests(spec, rate=20.0, num_requests=900, seed=3)
    assert len(requests) == 900 and [r.index for r in requests] == list(range(900))
    arrivals = [r.arrival for r in requests]
    assert arrivals == sorted(arrivals) and arrivals[-1] > 30.0  # the phases came round again
    for r in requests:
        mixed = PHASES[phase_of(spec.phase_seconds, r.arrival)] == "mixed-slo"
        assert (r.slo_class is not None) == mixed
    interactive = sum(r.slo_class == "interactive" for r in requests)
    assert interactive > 0.4 * sum(r.slo_class is not None for r in requests)
    assert build_requests(spec, rate=20.0, num_requests=900, seed=3) == requests


def test_a_duration_cuts_the_phases_and_bad_lengths_are_refused():
    spec = msgspec.structs.replace(workload("shifting"), phase_seconds=(5.0, 5.0, 5.0))
    requests = build_requests(spec, rate=10.0, duration=12.0, seed=0)
    assert requests and max(r.arrival for r in requests) < 12.0
    with pytest.raises(ValueError, match="phase_seconds"):
        build_requests(msgspec.structs.replace(spec, phase_seconds=(5.0, 0.0, 5.0)), rate=1.0,
                       num_requests=3)
    with pytest.raises(ValueError, match="phase_seconds"):
        build_requests(msgspec.structs.replace(workload("poisson"), phase_seconds=(1.0,) * 3),
                       rate=1.0, num_requests=3)


def test_goodput_is_reported_by_phase():
    good = dict(prompt_len=10, output_len=2, outcome="completed")
    records = [RequestRecord(index=0, arrival=1.0, first_token_time=1.1, token_times=[1.1, 1.2],
                             **good),
               RequestRecord(index=1, arrival=61.0, prompt_len=10, output_len=2),  # lost
               RequestRecord(index=2, arrival=181.0, first_token_time=181.1,
                             token_times=[181.1, 181.2], **good)]
    rows = per_phase(records, (), ttft_slo=1.0, tbt_slo=0.15)
    assert [(r.phase, r.good, r.num_requests) for r in rows] == [
        ("1: poisson", 2, 2), ("2: mixed-slo", 0, 1)]
