"""The capacity ruler's construction: every layout of a comparison gets the same routing,
SLOs, workload and warm-up rule; a capacity is found per seed from its own runs.

Covers: bench/ruler/ruler.py, bench/ruler/capacity.py.
"""
from __future__ import annotations

import msgspec
import pytest

from bench.loadgen.workloads import workload
from bench.ruler.capacity import find_capacity
from bench.ruler.ruler import (
    Point, RulerConfig, SeedCapacity, Subject, seed_capacity, sim_config, workload_requests,
)
from daemon.core.controller_config import ControllerConfig
from engines.scheduler_config import SchedulerConfig
from policies.routing import Routing


@pytest.mark.parametrize("routing", list(Routing))
def test_every_layout_of_a_comparison_routes_alike(routing):
    config = RulerConfig(controller=ControllerConfig(routing=routing))
    subjects = [Subject(label="a", layout="2L1H"), Subject(label="b", layout="3xvllm"),
                Subject(label="c", layout="3xsarathi", scheduler=SchedulerConfig(chunk_size=512))]
    configs = [sim_config(s, config) for s in subjects]
    assert {c.controller.routing for c in configs} == {routing}
    assert len({(c.slo, c.profile, c.max_model_len) for c in configs}) == 1
    assert [c.scheduler.chunk_size for c in configs] == [2048, 2048, 512]


def test_a_seed_gives_its_own_requests_and_the_same_ones_every_time():
    config = RulerConfig(workload=workload("bursty-cv2"), measured=80)
    first, again = workload_requests(config, 5.0, 0), workload_requests(config, 5.0, 0)
    other = workload_requests(config, 5.0, 1)
    assert first == again and first != other and len(first) == 100


@pytest.mark.slow
def test_a_seed_capacity_brackets_its_edge_within_the_tolerance():
    config = RulerConfig(measured=120, tolerance=0.05, latency="constant:0.01",
                         num_kv_blocks=4096, max_model_len=2048)
    result = seed_capacity(Subject(label="x", layout="1xsarathi"), config, 0, start_qps=4.0)
    held = [p.qps for p in result.points if p.holds]
    failed = [p.qps for p in result.points if not p.holds]
    assert result.capacity_qps == pytest.approx(max(held), abs=1e-3) and failed
    assert min(q for q in failed if q > max(held)) <= max(held) / 0.95
    assert all(p.holds == (p.qps <= max(held)) for p in result.points)  # one edge


def _point(qps: float, holds: bool) -> Point:
    return Point(qps=qps, holds=holds, goodput_pct=95.0 if holds else 50.0,
                 window_goodput_pct=[], stopped_early=False, offloaded=0, dropped=0, wall_s=0.0)


def test_a_search_that_never_finds_the_edge_is_called_out(capsys):
    from bench.sim.simulate_cmd import _warn_unbracketed
    only_held = SeedCapacity(0, 64.0, [_point(q, True) for q in (16.0, 32.0, 64.0)], False)
    none_held = SeedCapacity(1, 0.0, [_point(q, False) for q in (1.0, 0.5)], False)
    found = SeedCapacity(2, 8.0, [_point(8.0, True), _point(8.2, False)], True)
    _warn_unbracketed([only_held, none_held, found], RulerConfig(workload=workload("replay")))
    err = capsys.readouterr().err
    assert "seed 0: every rate tried held, up to 64 QPS" in err
    assert "seed 1: no rate tried held, down to 0.5 QPS" in err
    assert "seed 2" not in err


def test_fair_capacity_is_found_even_far_under_the_capacity(monkeypatch):
    """Bursty traffic: the usual rule holds up to 10 QPS but the longest class reaches its
    floor only up to 1 QPS. The fair search walks down from 10 in wide steps and brackets
    1 QPS (a narrow step ran out of runs before it and reported 0)."""
    import bench.ruler.ruler as ruler

    def fake_point(subject, config, qps, seed, classes=None):
        holds = qps <= 10.0
        return msgspec.structs.replace(_point(qps, holds), fair_holds=holds and qps <= 1.0)

    monkeypatch.setattr(ruler, "run_point", fake_point)
    monkeypatch.setattr(ruler, "ruler_classes", lambda config: None)
    result = seed_capacity(Subject(label="x", layout="2L1H"), RulerConfig(tolerance=0.03), 0,
                           start_qps=8.0)
    assert result.capacity_qps == pytest.approx(10.0, rel=0.03) and result.bracketed
    assert result.fair_capacity_qps == pytest.approx(1.0, rel=0.03) and result.fair_bracketed


def test_fair_capacity_never_exceeds_the_capacity(monkeypatch):
    """Goodput is noisy near the edge: a rate above the capacity that the capacity search
    never tried may hold by luck. The fair search starts at the capacity, in wider steps
    than a capacity search begun near its answer, and must not climb to such a rate (a plan
    showed a fair capacity over its capacity)."""
    import bench.ruler.ruler as ruler
    searches = []

    def search(*args, **kwargs):
        found = find_capacity(*args, **kwargs)
        searches.append(found)
        return found

    def fake_point(subject, config, qps, seed, classes=None):
        lucky = bool(searches)              # after the capacity search: every rate holds
        holds = qps <= 10.0 or lucky
        return msgspec.structs.replace(_point(qps, holds), fair_holds=holds)

    monkeypatch.setattr(ruler, "find_capacity", search)
    monkeypatch.setattr(ruler, "run_point", fake_point)
    monkeypatch.setattr(ruler, "ruler_classes", lambda config: None)
    result = seed_capacity(Subject(label="x", layout="2L1H"), RulerConfig(tolerance=0.03), 0,
                           start_qps=8.0, growth=1.1)
    assert result.capacity_qps == pytest.approx(10.0, rel=0.03)
    assert result.fair_capacity_qps == result.capacity_qps


def test_the_fair_search_starts_from_the_bracket_the_capacity_search_already_ran(monkeypatch):
    """A search started near the answer in 5 % steps runs rates under the fair edge on its
    way up: the fair search bisects between those it already has (a fair one held, one
    above failed the floor) instead of stepping down from the capacity again."""
    import bench.ruler.ruler as ruler
    runs = []

    def fake_point(subject, config, qps, seed, classes=None):
        runs.append(qps)
        holds = qps <= 10.0
        return msgspec.structs.replace(_point(qps, holds), fair_holds=holds and qps <= 9.0)

    monkeypatch.setattr(ruler, "run_point", fake_point)
    monkeypatch.setattr(ruler, "ruler_classes", lambda config: None)
    result = seed_capacity(Subject(label="x", layout="2L1H"), RulerConfig(tolerance=0.03), 0,
                           start_qps=8.0, growth=1.05)
    assert result.capacity_qps == pytest.approx(10.0, rel=0.03) and result.bracketed
    assert result.fair_capacity_qps == pytest.approx(9.0, rel=0.03) and result.fair_bracketed
    assert min(runs) == 8.0                 # never under the capacity search's own start
    assert len(runs) == len(set(runs))      # no rate run twice
