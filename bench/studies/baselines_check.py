"""`python -m bench.studies.baselines_check --out DIR`: the faithful baselines (docs/baselines.md)
on the ruler, in one run -- the evidence of issue #31.

Phases (`--phases`, default all; each writes DIR/<phase>.json as it ends):

* `storm`: every baseline layout on 3 A100-profile instances, 1,500 ShareGPT requests at
  15 QPS (seed 0, a drop rule): preemptions per instance, the longest gap between two
  tokens of any request, goodput and how long the run lasted.
* `capacity`: the capacity table (bench/ruler/capacity_table.py: the four baselines swept and
  measured with and without a drop rule, 2L1H and 1L2H, P/D splits) on `--workloads`.
* `overload`: good requests per second at 1x, 1.5x, 2x and 3x the best baseline's
  capacity (from the `capacity` phase), for 2L1H and every baseline at its tuned setting
  with a drop rule, `--minutes` simulated minutes each.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import msgspec

from bench.json_file import write_json
from bench.loadgen.workloads import build_requests, workload
from bench.parallel import add_workers_flag, run_parallel
from bench.ruler.capacity_table import SWEEPS, UPSTREAM, capacity_table
from bench.ruler.ruler import RulerConfig, Subject, sim_config
from bench.sim.box_run import simulate
from bench.studies.reproduce import CAPACITY_WORKLOADS
from daemon.core.controller_config import ControllerConfig
from engines.scheduler_config import SchedulerConfig

STORM_QPS, STORM_REQUESTS = 15.0, 1500
OVERLOAD_FACTORS = (1.0, 1.5, 2.0, 3.0)


class StormRow(msgspec.Struct, kw_only=True):
    layout: str
    chunk_size: int
    preemptions: list[int]          # per instance
    max_tbt_s: float                # the longest gap between two tokens of any request
    goodput_pct: float
    dropped: int
    duration_s: float               # simulated: the last answer's time


class OverloadPoint(msgspec.Struct, kw_only=True):
    workload: str
    layout: str
    chunk_size: int
    factor: float                   # of the best baseline's mean capacity
    qps: float
    good_per_s: float
    goodput_pct: float
    dropped: int


def _simulate(subject: Subject, workload_name: str, qps: float, n: int, seed: int = 0):
    config = RulerConfig(workload=workload(workload_name),
                         controller=ControllerConfig(shed="drop"))
    requests = build_requests(config.workload, rate=qps, num_requests=n, seed=seed,
                              max_model_len=config.max_model_len)
    return simulate(sim_config(subject, config), requests, seed=seed, keep_records=True,
                    config={"layout": subject.layout, "qps": qps})


def _storm_row(job: tuple[str, int]) -> StormRow:
    layout, chunk = job
    subject = Subject(label=layout, layout=layout,
                      scheduler=SchedulerConfig(chunk_size=chunk, drop_expired=True))
    r = _simulate(subject, "poisson", STORM_QPS, STORM_REQUESTS)
    return StormRow(layout=layout, chunk_size=chunk,
                    preemptions=[i["preemptions"] for i in r.per_instance],
                    max_tbt_s=round(max((x.max_tbt() or 0.0 for x in r.records)), 3),
                    goodput_pct=round(r.goodput_pct, 2), dropped=r.dropped,
                    duration_s=round(r.duration_s, 1))


def storm(workers: int | None = None) -> list[StormRow]:
    jobs = sorted({(layout, size) for layout in SWEEPS for size in (UPSTREAM[layout],
                                                                    max(SWEEPS[layout]))})
    rows = run_parallel(_storm_row, jobs, workers)
    print("storm: 3 instances, 15 QPS, 1,500 requests, seed 0, drop rule")
    for row in rows:
        print(f"  {row.layout:>10}@{row.chunk_size:<6} preemptions {row.preemptions}, "
              f"max TBT {row.max_tbt_s:.1f} s, goodput {row.goodput_pct:.1f} %, "
              f"dropped {row.dropped}, lasted {row.duration_s:.0f} s")
    return rows


def _overload_point(job) -> OverloadPoint:
    name, layout, chunk, factor, qps, n = job
    drops = layout in SWEEPS
    subject = Subject(label=layout, layout=layout,
                      scheduler=SchedulerConfig(chunk_size=chunk, drop_expired=drops))
    r = _simulate(subject, name, qps, n)
    return OverloadPoint(workload=name, layout=layout, chunk_size=chunk, factor=factor,
                         qps=round(qps, 3), good_per_s=round(r.goodput_rps, 3),
                         goodput_pct=round(r.goodput_pct, 2), dropped=r.dropped)


def overload(tables: list[dict], minutes: float,
             workers: int | None = None) -> list[OverloadPoint]:
    jobs = []
    for table in tables:
        best = next(r for r in table["rows"] if r["label"] == table["best_baseline"])
        tuned = {r["layout"]: r["chunk_size"] for r in table["rows"]
                 if r["label"].endswith("(tuned)")}
        for factor in OVERLOAD_FACTORS:
            qps = factor * best["mean_qps"]
            n = int(qps * 60 * minutes)
            jobs += [(table["workload"], layout, chunk, factor, qps, n)
                     for layout, chunk in {**tuned, "2L1H": SchedulerConfig().chunk_size}.items()]
    points = run_parallel(_overload_point, jobs, workers)
    for p in points:
        print(f"  {p.workload:>10} x{p.factor:<4g} {p.layout:>10}@{p.chunk_size:<6} "
              f"{p.good_per_s:6.2f} good/s ({p.goodput_pct:.1f} %)")
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.baselines_check",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--phases", default="storm,capacity,overload")
    parser.add_argument("--workloads", default=",".join(CAPACITY_WORKLOADS))
    parser.add_argument("--measured", type=int, default=RulerConfig().measured)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--minutes", type=float, default=5.0)
    add_workers_flag(parser)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    phases = args.phases.split(",")
    if "storm" in phases:
        write_json(args.out / "storm.json", storm(args.workers))
    if "capacity" in phases:
        seeds = tuple(int(s) for s in args.seeds.split(","))
        configs = [RulerConfig(workload=workload(name), measured=args.measured, seeds=seeds)
                   for name in args.workloads.split(",")]
        write_json(args.out / "capacity.json",
                   capacity_table(configs, workers=args.workers, progress=print))
    if "overload" in phases:
        tables = json.loads((args.out / "capacity.json").read_text())
        write_json(args.out / "overload.json", overload(tables, args.minutes, args.workers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
