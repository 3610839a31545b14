"""`python -m bench.studies.fairness --out DIR`: who pays for a capacity -- per-fair floors
on the ruler, Pareto tables at equal load (docs/fairness.md).

Phases (`--phases`, default both; each writes DIR/<phase>.json as it ends):

* `capacity`: the capacity table (bench/ruler/capacity_table.py) on `--workloads`, every
  row with its capacity and its fair capacity (every request class at `--fair-floor`),
  beside the three ceilings (all served, cheapest 90 %, fair).
* `pareto`: for each workload, at the best baseline's capacity (from `capacity`), every
  row of the table (Ascendra's layouts, each baseline at its tuned setting with and
  without drops) simulated to the end on every seed: each class's goodput over the
  measured requests (mean over seeds), request and token goodput, and the classes where
  a layout is worse than the best baseline.
* `shedding`: fairness-aware shedding's effect: 2L1H with the controller's `class_floor` at
  0 (the paper's rule) and at its default, each on every seed -- capacity, fair capacity,
  and each class's goodput at the best baseline's capacity.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import msgspec

from bench.json_file import write_json
from bench.loadgen.workloads import WorkloadSpec, workload
from bench.parallel import add_workers_flag, run_parallel
from bench.ruler.capacity_table import capacity_table, parse_settings, settings_table
from bench.ruler.ruler import (
    NEAR_GROWTH, RulerConfig, SeedCapacity, Subject, ruler_classes, seed_capacity, sim_config,
    workload_requests,
)
from bench.ruler.steady_state import judge
from bench.sim.simulator import Simulation
from bench.studies.reproduce import CAPACITY_WORKLOADS
from daemon.core.controller_config import ControllerConfig
from engines.scheduler_config import SchedulerConfig
from policies.routing import Routing

#: A class counts as worse when its goodput is this many points under the reference's.
WORSE_BY = 0.5


class ParetoRow(msgspec.Struct, kw_only=True):
    label: str
    goodput_pct: float                  # measured requests, mean over seeds
    token_goodput_pct: float
    classes: dict[str, float]           # class name -> goodput %, mean over seeds
    #: Classes at least WORSE_BY points under the best baseline's (none for itself).
    worse_than_best_baseline: list[str] = []
    #: For each of those classes, on how many seeds it was WORSE_BY points under the best
    #: baseline on the same requests: a loss on every seed, or noise around a tie.
    worse_on_seeds: dict[str, int] = {}
    #: For each class, this row's goodput minus the best baseline's on the same requests,
    #: mean over seeds (points), and that mean's standard error: a margin within about two
    #: standard errors of zero is a tie, whichever its sign.
    margin: dict[str, float] = {}
    margin_se: dict[str, float] = {}


class ParetoTable(msgspec.Struct, kw_only=True):
    workload: str
    qps: float                          # the best baseline's mean capacity
    best_baseline: str
    prompt_class_bounds: tuple[int, ...]
    seeds: tuple[int, ...]
    rows: list[ParetoRow]


def _subject(row: dict) -> Subject:
    routing = row.get("routing")
    return Subject(label=row["label"], layout=row["layout"],
                   scheduler=SchedulerConfig(chunk_size=row["chunk_size"],
                                             drop_expired=row["drop_expired"]),
                   routing=None if routing is None else Routing(routing))


def _point(job: tuple[Subject, RulerConfig, float, int]) -> tuple[float, float, dict]:
    """One subject at one rate and seed, run to the end: (goodput, token goodput, classes)."""
    subject, config, qps, seed = job
    records = Simulation(sim_config(subject, config),
                         workload_requests(config, qps, seed)).run()
    verdict = judge(records, config.target, config.slo.ttft_slo, config.slo.tbt_slo,
                    config.rule, ruler_classes(config), config.fair_floor)
    return (verdict.goodput_pct, verdict.token_goodput_pct,
            {c.name: c.goodput_pct for c in verdict.classes})


def pareto(tables: list[dict], config_of: dict[str, RulerConfig],
           workers: int | None = None) -> list[ParetoTable]:
    jobs, keys = [], []
    for table in tables:
        config = config_of[table["workload"]]
        qps = next(r for r in table["rows"] if r["label"] == table["best_baseline"])["mean_qps"]
        rows = [r for r in table["rows"] if "upstream" not in r["label"]]
        for row in rows:
            for seed in config.seeds:
                jobs.append((_subject(row), config, qps, seed))
                keys.append((table["workload"], row["label"]))
    results = run_parallel(_point, jobs, workers)
    by_key: dict[tuple[str, str], list] = {}
    for key, result in zip(keys, results):
        by_key.setdefault(key, []).append(result)
    return [_table(t, config_of[t["workload"]], by_key) for t in tables]


def _table(table: dict, config: RulerConfig, by_key: dict) -> ParetoTable:
    rows = []
    for label in dict.fromkeys(label for (name, label) in by_key if name == table["workload"]):
        rows.append(_averaged(label, by_key[(table["workload"], label)]))
    best = next(r for r in rows if r.label == table["best_baseline"])
    best_runs = by_key[(table["workload"], best.label)]
    for row in rows:
        row.worse_than_best_baseline = [n for n, pct in row.classes.items()
                                        if pct < best.classes.get(n, 0.0) - WORSE_BY
                                        and row is not best]
        runs = by_key[(table["workload"], row.label)]
        row.worse_on_seeds = {n: _seeds_worse(n, runs, best_runs)
                              for n in row.worse_than_best_baseline}
        if row is not best:
            row.margin, row.margin_se = _margins(runs, best_runs)
    qps = next(r for r in table["rows"] if r["label"] == table["best_baseline"])["mean_qps"]
    return ParetoTable(workload=table["workload"], qps=qps, best_baseline=table["best_baseline"],
                       prompt_class_bounds=ruler_classes(config).prompt_bounds,
                       seeds=config.seeds, rows=rows)


def _seeds_worse(name: str, runs: list[tuple[float, float, dict]],
                 best_runs: list[tuple[float, float, dict]]) -> int:
    """Seeds (paired: the same requests) on which class `name` is WORSE_BY points under
    the best baseline's."""
    return sum(mine[2].get(name, 0.0) < theirs[2].get(name, 0.0) - WORSE_BY
               for mine, theirs in zip(runs, best_runs))


def _margins(runs: list[tuple[float, float, dict]], best_runs: list[tuple[float, float, dict]],
             ) -> tuple[dict[str, float], dict[str, float]]:
    """Per class, the paired per-seed differences from the best baseline: their mean and
    its standard error (0 with one seed)."""
    margin, se = {}, {}
    for name in dict.fromkeys(n for _, _, classes in runs for n in classes):
        diffs = [mine[2][name] - theirs[2][name] for mine, theirs in zip(runs, best_runs)
                 if name in mine[2] and name in theirs[2]]
        if not diffs:
            continue
        margin[name] = round(statistics.fmean(diffs), 2)
        se[name] = round(statistics.stdev(diffs) / math.sqrt(len(diffs)), 2) if len(diffs) > 1 else 0.0
    return margin, se


def _averaged(label: str, runs: list[tuple[float, float, dict]]) -> ParetoRow:
    """One row from its seeds' `_point` results: each figure's mean over the seeds."""
    names = list(dict.fromkeys(n for _, _, classes in runs for n in classes))
    return ParetoRow(label=label, goodput_pct=_mean([g for g, _, _ in runs]),
                     token_goodput_pct=_mean([t for _, t, _ in runs]),
                     classes={n: _mean([c[n] for _, _, c in runs if n in c]) for n in names})


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 2) if values else 0.0


def print_pareto(tables: list[ParetoTable]) -> None:
    for t in tables:
        names = list(t.rows[0].classes)
        print(f"\n{t.workload}: every row at {t.qps:.2f} QPS (the best baseline, "
              f"{t.best_baseline}), seeds {list(t.seeds)}; goodput % per class")
        print(f"  {'row':>26} " + " ".join(f"{n:>16}" for n in names)
              + f" {'overall':>8} {'tokens':>7}  worse than the best baseline")
        for r in t.rows:
            print(f"  {r.label:>26} " + " ".join(f"{r.classes.get(n, 0.0):16.1f}" for n in names)
                  + f" {r.goodput_pct:8.1f} {r.token_goodput_pct:7.1f}  "
                  + (", ".join(f"{n} (on {r.worse_on_seeds[n]} of {len(t.seeds)} seeds)"
                               for n in r.worse_than_best_baseline) or "-"))
        for r in t.rows:
            if r.margin:
                print(f"  {r.label:>26} minus the best baseline, points (± standard error): "
                      + ", ".join(f"{n} {r.margin[n]:+.1f} ± {r.margin_se[n]:.1f}" for n in r.margin))


class SheddingRow(msgspec.Struct, kw_only=True):
    workload: str
    class_floor: float
    capacity_qps: list[float]           # per seed
    fair_capacity_qps: list[float]
    at_best_baseline: ParetoRow         # every class at the best baseline's capacity


def _capacity(job: tuple[Subject, RulerConfig, int, float]) -> SeedCapacity:
    subject, config, seed, start = job
    return seed_capacity(subject, config, seed, start, NEAR_GROWTH)


def shedding(tables: list[dict], config_of: dict[str, RulerConfig], floors: tuple[float, ...],
             workers: int | None = None) -> list[SheddingRow]:
    """2L1H under each controller class floor: capacity searches from the table's 2L1H
    capacity, and every class at the best baseline's capacity."""
    subject = Subject(label="2L1H", layout="2L1H")
    cap_jobs, point_jobs, keys = [], [], []
    for table in tables:
        base = config_of[table["workload"]]
        start = next(r for r in table["rows"] if r["label"] == "2L1H")["mean_qps"]
        qps = next(r for r in table["rows"] if r["label"] == table["best_baseline"])["mean_qps"]
        for floor in floors:
            config = msgspec.structs.replace(base, controller=msgspec.structs.replace(
                base.controller, class_floor=floor))
            keys.append((table["workload"], floor))
            cap_jobs += [(subject, config, seed, start) for seed in config.seeds]
            point_jobs += [(subject, config, qps, seed) for seed in config.seeds]
    caps = run_parallel(_capacity, cap_jobs, workers)
    points = run_parallel(_point, point_jobs, workers)
    rows, n = [], len(next(iter(config_of.values())).seeds)
    for k, (name, floor) in enumerate(keys):
        mine = caps[k * n:(k + 1) * n]
        rows.append(SheddingRow(
            workload=name, class_floor=floor,
            capacity_qps=[c.capacity_qps for c in mine],
            fair_capacity_qps=[c.fair_capacity_qps for c in mine],
            at_best_baseline=_averaged(f"2L1H class_floor {floor:g}",
                                       points[k * n:(k + 1) * n])))
    for r in rows:
        print(f"  {r.workload:>10} class_floor {r.class_floor:g}: capacity "
              f"{_mean(r.capacity_qps):.2f} {r.capacity_qps}, fair {_mean(r.fair_capacity_qps):.2f} "
              f"{r.fair_capacity_qps}; at the best baseline's capacity: "
              + ", ".join(f"{c} {v:.1f}" for c, v in r.at_best_baseline.classes.items()))
    return rows


def print_capacity(tables: list[dict]) -> None:
    for t in tables:
        print(f"\n{t['workload']}: ceilings {t['ceiling_qps']:.2f} (all served), "
              f"{t['ceiling_90_qps']:.2f} (cheapest 90 %), {t['fair_ceiling_qps']:.2f} (fair); "
              f"prompt classes at {list(t['prompt_class_bounds'])} tokens")
        print(f"  {'row':>26} {'capacity':>18} {'ratio':>6} {'fair capacity':>18} {'ratio':>6}")
        for r in t["rows"]:
            print(f"  {r['label']:>26} {r['mean_qps']:6.2f} [{r['min_qps']:.2f}-{r['max_qps']:.2f}]"
                  f" {r['ratio_to_best_baseline'] or 0:6.2f} {r['fair_mean_qps']:6.2f} "
                  f"[{r['fair_min_qps']:.2f}-{r['fair_max_qps']:.2f}] "
                  f"{r['fair_ratio_to_best_baseline'] or 0:6.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.fairness",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--phases", default="capacity,pareto,shedding")
    parser.add_argument("--settings", default="",
                        help="comma-separated settings instead of the full sweep: layouts, "
                             "and baselines as layout@chunk[+drops][/ROUTING]")
    parser.add_argument("--class-floors", default=f"0,{ControllerConfig().class_floor:g}",
                        help="the controller class floors the shedding phase compares")
    parser.add_argument("--workloads", default=",".join(CAPACITY_WORKLOADS))
    parser.add_argument("--trace", default=WorkloadSpec().trace,
                        help="the trace of every workload: its lengths, and for `replay` its "
                             "arrival times (azure-conv)")
    parser.add_argument("--measured", type=int, default=RulerConfig().measured)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--fair-floor", type=float, default=RulerConfig().fair_floor)
    parser.add_argument("--hps-in-bursts", action=argparse.BooleanOptionalAction,
                        default=ControllerConfig().hps_in_bursts,
                        help="every phase with the controller's hps_in_bursts on or off (an "
                             "<n>A layout keeps HPs while arrivals come in bursts)")
    add_workers_flag(parser)
    args = parser.parse_args(argv)
    if args.settings:
        try:
            parse_settings(args.settings.split(","))
        except ValueError as error:
            parser.error(f"--settings: {error}")
    args.out.mkdir(parents=True, exist_ok=True)
    seeds = tuple(int(s) for s in args.seeds.split(","))
    controller = ControllerConfig(hps_in_bursts=args.hps_in_bursts)
    config_of = {name: RulerConfig(workload=workload(name, trace=args.trace),
                                   measured=args.measured, seeds=seeds,
                                   fair_floor=args.fair_floor, controller=controller)
                 for name in args.workloads.split(",")}
    phases = args.phases.split(",")
    if "capacity" in phases:
        configs = list(config_of.values())
        tables = (settings_table(configs, args.settings.split(","), args.workers, print)
                  if args.settings else capacity_table(configs, workers=args.workers,
                                                       progress=print))
        write_json(args.out / "capacity.json", tables)
    tables = json.loads((args.out / "capacity.json").read_text())
    print_capacity(tables)
    if "pareto" in phases:
        result = pareto(tables, config_of, args.workers)
        write_json(args.out / "pareto.json", result)
        print_pareto(result)
    if "shedding" in phases:
        floors = tuple(float(f) for f in args.class_floors.split(","))
        write_json(args.out / "shedding.json", shedding(tables, config_of, floors, args.workers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
