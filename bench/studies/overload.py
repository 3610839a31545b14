"""Overload: how many requests each layout serves within their SLOs when the load is past
its capacity -- at one rate (issue #14: 15 QPS for 10 simulated minutes on ShareGPT, about
1.5x the best baseline's capacity) or along a curve of multiples of a capacity
(`--capacity C --loads 1,1.5,2,3`: good requests per second at each).

Every layout gets a drop rule -- a waiting request whose TTFT SLO is lost is dropped with
a clear answer (the baselines' `+drops`, their `drop_expired`; Ascendra's controller sheds
what it predicts cannot make it, `shed = drop`) -- and every request must get a terminal
answer (none lost). The baselines run at the settings the capacity table's poisson sweep
found best (`--settings`, as `bench.studies.fairness` takes them). Prints one row per
layout and rate with the ratio to the best baseline at that rate, and what starvation
would show: the p99 TTFT of the requests served, the longest any request waited for its
first answer (first token or drop) in multiples of its TTFT target, and the share of
offloaded requests that met their SLO.

    python -m bench.studies.overload [--qps 15 | --capacity C --loads 1,1.5,2,3]
        [--minutes 10] [--seed 0] [--settings S,...] [--workers N] [--json OUT]
"""
from __future__ import annotations

import argparse

import msgspec

from bench.json_file import write_json
from bench.loadgen.workloads import build_requests, workload
from bench.parallel import add_workers_flag, run_parallel
from bench.records.schema import RunResult
from bench.records.results import is_good
from bench.ruler.capacity_table import SWEEPS, parse_settings
from bench.records.request_classes import RequestClasses, class_goodput
from bench.ruler.ruler import RulerConfig, Subject, ruler_classes, sim_config
from bench.sim.box_run import simulate
from bench.sim.sim_flags import on_profile, profile_argument
from daemon.core.controller_config import ControllerConfig

#: Ascendra's layouts, and each faithful baseline at its best poisson setting with drops
#: (docs/results.md, "Capacity with the faithful baselines").
DEFAULT_SETTINGS = ("3A,2L1H,3xvllm-v0@8192+drops,3xvllm-v1@8192+drops,3xsglang@4096+drops,"
                    "3xsarathi@2048+drops")


class OverloadRow(msgspec.Struct, kw_only=True):
    layout: str                         # the setting: layout, or layout@chunk drops
    qps: float
    load: float | None                  # qps / --capacity on a curve
    good_per_s: float                   # requests within SLO per second of arrivals
    requests: int
    within_slo: int
    goodput_pct: float
    completed: int
    dropped: int
    errored: int
    lost: int
    ratio_to_best_baseline: float | None
    p99_ttft_s: float | None            # of the completed requests
    max_wait_slo_multiple: float        # longest wait for a first answer / its TTFT target
    offloaded: int
    offloaded_within_slo: int
    #: Goodput of each prompt-length quartile of the workload (who pays for the rest).
    quartile_goodput_pct: dict[str, float] = {}


def overload_row(layout: str, qps: float, load: float | None, r: RunResult,
                 best: int, classes: RequestClasses) -> OverloadRow:
    records = r.records or []
    waits = [w / r.ttft_slo_s for w in (x.answer_wait() for x in records) if w is not None]
    moved = [x for x in records if x.offloaded]
    return OverloadRow(
        layout=layout, qps=round(qps, 3), load=load,
        good_per_s=round(r.good * qps / r.num_requests, 3) if r.num_requests else 0.0,
        requests=r.num_requests, within_slo=r.good, goodput_pct=r.goodput_pct,
        completed=r.completed, dropped=r.dropped, errored=r.errored, lost=r.lost,
        ratio_to_best_baseline=round(r.good / best, 3) if best else None,
        p99_ttft_s=r.ttft_s.p99, max_wait_slo_multiple=round(max(waits, default=0.0), 2),
        offloaded=len(moved),
        offloaded_within_slo=sum(is_good(x, r.ttft_slo_s, r.tbt_slo_s) for x in moved),
        quartile_goodput_pct={c.name: round(c.goodput_pct, 1) for c in class_goodput(
            records, classes, r.ttft_slo_s, r.tbt_slo_s)})


def overload_config(profile: str = RulerConfig().profile,
                    max_model_len: int | None = None) -> RulerConfig:
    """Every run's settings: drops on, the profile at its own SLOs."""
    return on_profile(RulerConfig(controller=ControllerConfig(shed="drop")), profile,
                      max_model_len)


def _run(job: tuple[Subject, float, int, int, RulerConfig]) -> RunResult:
    subject, qps, n, seed, config = job
    requests = build_requests(workload("poisson"), rate=qps, num_requests=n, seed=seed,
                              max_model_len=config.max_model_len)
    return simulate(sim_config(subject, config), requests, seed=seed,
                    config={"layout": subject.label, "qps": qps}, keep_records=True)


def overload(subjects: list[Subject], rates: list[tuple[float, float | None]], minutes: float,
             seed: int, workers: int | None = None,
             config: RulerConfig | None = None) -> list[OverloadRow]:
    """Every subject at every (qps, load), each rate's rows against its best baseline
    (`config`: `overload_config()`'s unless given)."""
    config = config or overload_config()
    jobs = [(subject, qps, round(qps * minutes * 60), seed, config)
            for qps, _ in rates for subject in subjects]
    results = run_parallel(_run, jobs, workers)
    classes = ruler_classes(config)
    rows = []
    for k, (qps, load) in enumerate(rates):
        mine = results[k * len(subjects):(k + 1) * len(subjects)]
        best = max((r.good for s, r in zip(subjects, mine) if s.layout in SWEEPS), default=0)
        rows += [overload_row(s.label, qps, load, r, best, classes)
                 for s, r in zip(subjects, mine)]
    return rows


def print_rows(rows: list[OverloadRow]) -> None:
    print(f"{'layout':>22} {'QPS':>6} {'load':>5} {'good/s':>7} {'within SLO':>11} "
          f"{'share':>7} {'completed':>10} {'dropped':>8} {'lost':>5} {'vs best':>8} "
          f"{'p99 TTFT':>9} {'max wait':>9} {'offloads met':>13}  goodput by prompt quartile")
    for row in rows:
        ratio = f"{row.ratio_to_best_baseline:.2f}x" if row.ratio_to_best_baseline else "-"
        p99 = f"{row.p99_ttft_s:.2f} s" if row.p99_ttft_s is not None else "-"
        moved = f"{row.offloaded_within_slo}/{row.offloaded}" if row.offloaded else "-"
        load = f"{row.load:g}x" if row.load is not None else "-"
        print(f"{row.layout:>22} {row.qps:>6.2f} {load:>5} {row.good_per_s:>7.2f} "
              f"{row.within_slo:>11} {row.goodput_pct:>6.1f}% {row.completed:>10} "
              f"{row.dropped:>8} {row.lost:>5} {ratio:>8} {p99:>9} "
              f"{row.max_wait_slo_multiple:>8.1f}x {moved:>13}  "
              + " ".join(f"{v:.0f}" for v in row.quartile_goodput_pct.values()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.overload", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qps", type=float, default=15.0, help="one rate (default %(default)s)")
    parser.add_argument("--capacity", type=float,
                        help="a curve instead: rates of --loads times this capacity (QPS)")
    parser.add_argument("--loads", default="1,1.5,2,3",
                        help="multiples of --capacity (default %(default)s)")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settings", default=DEFAULT_SETTINGS,
                        help="layouts, and baselines as layout@chunk[+drops]")
    parser.add_argument("--profile", default=RulerConfig().profile, type=profile_argument,
                        help="a GPU profile or a profile file, at its own SLOs "
                             "(default %(default)s)")
    parser.add_argument("--max-model-len", type=int, default=RulerConfig().max_model_len)
    parser.add_argument("--json", help="write the rows (OverloadRow) here")
    add_workers_flag(parser)
    args = parser.parse_args(argv)
    try:
        subjects = parse_settings(args.settings.split(","))
        loads = [float(x) for x in args.loads.split(",")]
    except ValueError as error:
        parser.error(str(error))
    rates = ([(args.capacity * load, load) for load in loads] if args.capacity
             else [(args.qps, None)])
    print(f"overload: ShareGPT, Poisson at {', '.join(f'{q:.2f}' for q, _ in rates)} QPS for "
          f"{args.minutes:g} simulated minutes each, {args.profile}, seed {args.seed}; "
          f"drops on everywhere")
    rows = overload(subjects, rates, args.minutes, args.seed, args.workers,
                    overload_config(args.profile, args.max_model_len))
    print_rows(rows)
    if args.json:
        write_json(args.json, {"rates": rates, "minutes": args.minutes, "seed": args.seed,
                               "rows": rows})
    return 0 if all(row.lost == 0 for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
