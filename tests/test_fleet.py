"""A fleet of boxes behind a model of the Inference Extension's endpoint picker: the
picker's choices (bench/sim/endpoint_picker.py), the gateway's stale view, every request
ending once, one box being exactly the single-box simulator, and `simulate --boxes`.

Covers: bench/sim/fleet.py, bench/sim/endpoint_picker.py.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import msgspec
import pytest

from daemon.cli import main as ascendra
from bench.loadgen.workloads import build_requests, workload
from bench.sim.fleet import Fleet, GatewayConfig
from bench.sim.fleet_run import FleetResult
from bench.sim.record_keeper import RecordKeeper
from bench.sim.simulator import Simulation
from bench.studies.fleet_scaling import NO_PICKER, ScalingConfig, _jobs, default_config
from daemon.core.events import Refuse, Settle
from daemon.gateway_view import gateway_view
from bench.sim.endpoint_picker import (
    Picker, epp_scores, kv_cache_scores, pick_endpoint, queue_scores,
)
from tests.simulator_helpers import sim_config


@dataclass(frozen=True)
class View:
    num_requests_waiting: int
    num_requests_running: int = 0
    kv_cache_usage_perc: float = 0.0


def requests(n: int, qps: float, seed: int = 0):
    return build_requests(workload("poisson"), rate=qps, num_requests=n, seed=seed,
                          max_model_len=8192)


# ---- the picker ----------------------------------------------------------------------------
def test_queue_scorer_is_min_max_normalised_and_neutral_when_equal():
    assert queue_scores([View(0), View(5), View(10)]) == [1.0, 0.5, 0.0]
    assert queue_scores([View(3), View(3)]) == [1.0, 1.0]
    assert kv_cache_scores([View(0, 0, 0.25), View(0, 0, 1.0)]) == [0.75, 0.0]


def test_epp_prefers_the_shorter_queue_when_kv_use_is_equal():
    views = [View(7, 4, 0.5), View(2, 4, 0.5), View(9, 4, 0.5)]
    for tie_break in (0.0, 0.5, 0.99):
        assert pick_endpoint(Picker.EPP, views, turn=0, tie_break=tie_break) == 1


def test_epp_prefers_lower_kv_use_when_queues_are_equal():
    views = [View(3, 4, 0.9), View(3, 4, 0.2), View(3, 4, 0.6)]
    assert pick_endpoint(Picker.EPP, views, turn=0, tie_break=0.0) == 1


def test_epp_weighs_queue_and_kv_equally_as_the_default_profile_does():
    # Box 0: shortest queue (queue score 1) but a full KV cache (0): 2*1 + 2*0 = 2.
    # Box 1: a longer queue (0.5) with an empty cache (1): 2*0.5 + 2*1 = 3 -- it wins.
    views = [View(0, 0, 1.0), View(5, 0, 0.0), View(10, 0, 0.5)]
    assert epp_scores(views) == [2.0, 3.0, 1.0]
    assert pick_endpoint(Picker.EPP, views, turn=0, tie_break=0.0) == 1


def test_least_queue_reads_only_the_queue():
    views = [View(4, 0, 0.0), View(1, 0, 1.0), View(2, 0, 0.0)]
    assert pick_endpoint(Picker.LEAST_QUEUE, views, turn=0, tie_break=0.0) == 1
    assert pick_endpoint(Picker.EPP, views, turn=0, tie_break=0.0) == 2  # its KV is free


def test_ties_are_broken_by_the_callers_draw_and_round_robin_takes_turns():
    idle = [View(0), View(0), View(0), View(0)]
    assert [pick_endpoint(Picker.EPP, idle, turn=0, tie_break=t)
            for t in (0.0, 0.3, 0.6, 0.9)] == [0, 1, 2, 3]
    busy = [View(9), View(0)]
    assert [pick_endpoint(Picker.ROUND_ROBIN, busy, turn=t, tie_break=0.0)
            for t in range(5)] == [0, 1, 0, 1, 0]
    with pytest.raises(ValueError):
        pick_endpoint(Picker.EPP, [], turn=0, tie_break=0.0)
    with pytest.raises(ValueError):
        pick_endpoint(Picker.EPP, idle, turn=0, tie_break=1.0)


# ---- the gateway's view --------------------------------------------------------------------
@pytest.mark.slow
def test_the_view_is_scraped_only_each_interval():
    work = requests(80, qps=20.0)
    fleet = Fleet([sim_config("2L1H")] * 2, work, GatewayConfig(refresh_interval=0.25))
    fleet.run()
    ages = [p.view_age for p in fleet.picks]
    assert all(0.0 <= age < 0.25 + 1e-9 for age in ages)
    # each pick read the scrape at the last multiple of the interval before its arrival
    arrivals = {w.index: w.arrival for w in work}
    for pick in fleet.picks:
        scraped = arrivals[pick.index] - pick.view_age
        assert scraped / 0.25 == pytest.approx(round(scraped / 0.25), abs=1e-6)


@pytest.mark.slow
def test_a_view_never_refreshed_is_the_idle_one_and_a_zero_interval_is_always_fresh():
    work = requests(40, qps=20.0)
    stale = Fleet([sim_config("2L1H")] * 2, work, GatewayConfig(refresh_interval=1e6))
    stale.run()
    assert all(v.num_requests_waiting == 0 and v.num_requests_running == 0
               for v in stale.views())
    assert [p.view_age for p in stale.picks] == pytest.approx([w.arrival for w in work])
    fresh = Fleet([sim_config("2L1H")] * 2, work, GatewayConfig(refresh_interval=0.0))
    fresh.run()
    assert all(p.view_age == 0.0 for p in fresh.picks)


def test_the_gateway_sees_what_gateway_view_computes_from_each_box():
    fleet = Fleet([sim_config("2L1H"), sim_config("3xsarathi")], requests(30, qps=30.0),
                  GatewayConfig(refresh_interval=0.0))
    while fleet.events and fleet.events.now < 0.5:
        fleet.events.run_next()
    fleet._scrape()
    assert fleet.views() == [gateway_view(box.controller.view) for box in fleet.boxes]
    assert sum(v.num_requests_waiting + v.num_requests_running for v in fleet.views()) > 0


# ---- the fleet -----------------------------------------------------------------------------
@pytest.mark.slow
def test_a_two_box_fleet_ends_every_request_exactly_once(monkeypatch):
    ends: Counter = Counter()
    observe = RecordKeeper.observe

    def counting(self, action, now):
        if isinstance(action, (Settle, Refuse)):
            ends[action.request_id] += 1
        observe(self, action, now)

    monkeypatch.setattr(RecordKeeper, "observe", counting)
    work = requests(120, qps=30.0)  # above two boxes' capacity: some are shed
    fleet = Fleet([sim_config("2L1H"), sim_config("3xsarathi")], work)
    records = fleet.run()
    assert sorted(r.index for r in records) == [w.index for w in work]
    assert ends == Counter({f"r{w.index}": 1 for w in work})
    assert all(r.outcome in ("completed", "dropped") and r.end_time is not None
               for r in records)
    assert sorted(p.index for p in fleet.picks) == [w.index for w in work]
    assert {p.box for p in fleet.picks} == {0, 1}
    for b, box in enumerate(fleet.boxes):
        assert set(box.records) == {f"r{p.index}" for p in fleet.picks if p.box == b}


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["2L1H", "3xsarathi"])
def test_one_box_behind_the_gateway_is_the_single_box_simulator(layout):
    work = requests(150, qps=11.0, seed=3)
    alone = sorted(Simulation(sim_config(layout), work).run(), key=lambda r: r.index)
    fleet = sorted(Fleet([sim_config(layout)], work, seed=3).run(), key=lambda r: r.index)
    assert fleet == alone


@pytest.mark.slow
def test_a_fleet_run_is_deterministic():
    work = requests(60, qps=25.0)
    runs = [Fleet([sim_config("2L1H")] * 3, work, seed=1) for _ in range(2)]
    for fleet in runs:
        fleet.run()
    assert runs[0].picks == runs[1].picks


# ---- the command line ----------------------------------------------------------------------
@pytest.mark.slow
def test_simulate_boxes_prints_and_writes_the_fleet(tmp_path, capsys):
    out = tmp_path / "fleet.json"
    code = ascendra(["simulate", "--boxes", "3", "--box-layouts", "2L1H,3xsarathi",
                     "--picker", "least_queue", "--refresh-interval", "0.1", "--qps", "24",
                     "--num-requests", "90", "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "fleet: 3 boxes, picker least_queue" in printed and "3xsarathi" in printed
    result = msgspec.json.decode(out.read_bytes(), type=FleetResult, strict=True)
    assert result.box_layouts == ["2L1H", "3xsarathi", "2L1H"]
    assert result.gateway == GatewayConfig(picker=Picker.LEAST_QUEUE, refresh_interval=0.1)
    assert sum(b.requests for b in result.boxes) == result.num_requests == 90
    assert sum(b.share_pct for b in result.boxes) == pytest.approx(100.0, abs=0.05)
    assert 0.0 <= result.goodput_pct <= 100.0 and result.mean_view_age_s < 0.1


def test_simulate_boxes_refuses_records_and_bad_counts(tmp_path, capsys):
    assert ascendra(["simulate", "--boxes", "2", "--qps", "5", "--num-requests", "4",
                     "--records", str(tmp_path / "r.jsonl")]) == 2
    assert ascendra(["simulate", "--boxes", "0", "--qps", "5", "--num-requests", "4"]) == 2
    assert "--boxes must be >= 1" in capsys.readouterr().err


# ---- the scaling table ---------------------------------------------------------------------
def test_the_scaling_table_runs_one_box_once_per_seed_and_every_picker_for_fleets():
    config = msgspec.structs.replace(default_config(), boxes=(1, 4), loads=(1.0,),
                                     seeds=(0, 1))
    jobs = _jobs(config)
    single = [j for j in jobs if j.boxes == 1]
    assert {j.picker for j in single} == {NO_PICKER}
    assert len(single) == len(config.kinds) * len(config.seeds)
    assert len(jobs) - len(single) == (len(config.kinds) * len(config.pickers)
                                       * len(config.seeds))
    kinds = {k.label: k for k in config.kinds}
    assert kinds["Ascendra"].subject.layout == "2L1H"
    assert kinds["baseline"].subject.layout == "3xsarathi"
    capacity = json.loads((default_config.__globals__["CAPACITY_FILE"]).read_text())
    assert kinds["Ascendra"].capacity_qps in {r["mean_qps"] for t in capacity["tables"]
                                              for r in t["rows"]}
    assert isinstance(config, ScalingConfig)


@pytest.mark.slow
def test_the_scaling_document_round_trips_and_draws(tmp_path):
    from bench.studies.fleet_scaling import FleetScaling, fleet_document, markdown_table
    config = msgspec.structs.replace(default_config(), boxes=(1, 2), loads=(1.0,), seeds=(0,),
                                     pickers=(Picker.EPP, Picker.ROUND_ROBIN),
                                     requests_per_box=20)
    said: list[str] = []
    doc = fleet_document(config, workers=1, progress=said.append)
    assert said[0].startswith("fleet scaling of {")       # the configuration, first
    assert [(r.kind, r.boxes, r.picker) for r in doc.rows] == [
        (kind, boxes, picker) for kind in ("Ascendra", "baseline")
        for boxes, picker in ((1, NO_PICKER), (2, "epp"), (2, "round_robin"))]
    assert all(r.qps == pytest.approx(r.load * r.boxes * next(
        k.capacity_qps for k in config.kinds if k.label == r.kind), abs=1e-3) for r in doc.rows)
    assert "| 2 | round_robin |" in markdown_table(doc)
    raw = msgspec.json.encode(doc)
    assert msgspec.json.decode(raw, type=FleetScaling, strict=True) == doc
    pytest.importorskip("matplotlib")  # in the `bench` extra, not the `test` one
    from bench.studies.figures import draw
    draw(json.loads(raw), tmp_path / "fleet.png")
    assert (tmp_path / "fleet.png").stat().st_size > 0
