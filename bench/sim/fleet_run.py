"""One fleet point: boxes behind a gateway at one arrival rate, judged as the ruler judges.

`run_fleet` builds the workload (bench/loadgen/workloads.py) at the fleet's total rate, drives
it through `bench.sim.fleet.Fleet` and reports the steady-state middle of the run
(bench/ruler/steady_state.py: warm-up and cool-down left out, windows checked), for the fleet
and for each box: what the gateway sent it and how much of that met its SLOs.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import msgspec

from bench.loadgen.workloads import build_requests
from bench.records.schema import RequestRecord
from bench.records.results import is_good
from bench.ruler.ruler import RulerConfig, Subject, sim_config
from bench.ruler.steady_state import judge
from bench.sim.fleet import Fleet, GatewayConfig


class BoxResult(msgspec.Struct, frozen=True, kw_only=True):
    box: int
    layout: str
    requests: int               # the gateway sent it, whole run
    share_pct: float            # of the fleet's requests
    measured: int               # of them in the fleet's measured middle
    goodput_pct: float          # of its measured requests, within SLO (0 with none)
    dropped: int                # shed or dropped, whole run
    offloaded: int              # moved LP -> HP, whole run
    #: What the gateway saw of it, mean over its scrapes: the protocol's three metrics.
    seen_waiting: float
    seen_running: float
    seen_kv_usage: float


class FleetResult(msgspec.Struct, frozen=True, kw_only=True):
    box_layouts: list[str]
    gateway: GatewayConfig
    qps: float                  # arrival rate at the gateway, requests/s
    num_requests: int
    seed: int
    goodput_pct: float          # measured requests within SLO, %
    goodput_rps: float          # measured requests within SLO per second of their arrivals
    window_goodput_pct: list[float]
    holds: bool                 # the ruler's verdict at `config.target`
    min_box_goodput_pct: float
    max_share_ratio: float      # the busiest box's share over an even share
    mean_view_age_s: float      # how old the gateway's view was at a pick, on average
    boxes: list[BoxResult]
    wall_s: float


def run_fleet(subjects: Sequence[Subject], config: RulerConfig, gateway: GatewayConfig,
              qps: float, num_requests: int, seed: int) -> FleetResult:
    """`num_requests` requests at `qps` in all, through one box per subject."""
    started = time.perf_counter()
    requests = build_requests(config.workload, rate=qps, num_requests=num_requests, seed=seed,
                              max_model_len=config.max_model_len)
    fleet = Fleet([sim_config(s, config) for s in subjects], requests, gateway, seed)
    records = fleet.run()
    box_of = {pick.index: pick.box for pick in fleet.picks}
    measured = config.rule.measured(records)
    verdict = judge(records, config.target, config.slo.ttft_slo, config.slo.tbt_slo,
                    config.rule)
    boxes = [_box(b, s.layout, [r for r in records if box_of[r.index] == b],
                  [r for r in measured if box_of[r.index] == b], len(records), config, seen)
             for (b, s), seen in zip(enumerate(subjects), fleet.mean_views())]
    span = measured[-1].arrival - measured[0].arrival if len(measured) > 1 else 0.0
    good = round(verdict.goodput_pct * verdict.num_measured / 100)
    return FleetResult(
        box_layouts=[s.layout for s in subjects], gateway=gateway, qps=qps,
        num_requests=len(records), seed=seed, goodput_pct=round(verdict.goodput_pct, 2),
        goodput_rps=round(good / span, 3) if span else 0.0,
        window_goodput_pct=[round(w, 2) for w in verdict.window_goodput_pct],
        holds=verdict.holds,
        min_box_goodput_pct=min((b.goodput_pct for b in boxes if b.measured), default=0.0),
        max_share_ratio=round(max(b.share_pct for b in boxes) * len(boxes) / 100, 3),
        mean_view_age_s=round(sum(p.view_age for p in fleet.picks) / max(1, len(fleet.picks)),
                              4),
        boxes=boxes, wall_s=round(time.perf_counter() - started, 2))


def _box(box: int, layout: str, mine: list[RequestRecord], measured: list[RequestRecord],
         total: int, config: RulerConfig, seen: tuple[float, float, float]) -> BoxResult:
    good = sum(is_good(r, config.slo.ttft_slo, config.slo.tbt_slo) for r in measured)
    return BoxResult(box=box, layout=layout, requests=len(mine),
                     share_pct=round(100.0 * len(mine) / total, 2), measured=len(measured),
                     goodput_pct=round(100.0 * good / len(measured), 2) if measured else 0.0,
                     dropped=sum(r.outcome == "dropped" for r in mine),
                     offloaded=sum(r.offloaded for r in mine),
                     seen_waiting=round(seen[0], 2), seen_running=round(seen[1], 2),
                     seen_kv_usage=round(seen[2], 4))
