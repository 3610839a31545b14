"""Overload: how many requests each layout serves within their SLOs when the load is far
past every layout's capacity (issue #14: 15 QPS for 10 simulated minutes on ShareGPT,
9,000 requests, about 1.5x the best baseline's capacity).

Every layout gets the same drop rule -- a waiting request whose TTFT SLO is lost is
dropped with a clear answer (the baselines' `drop_expired`; Ascendra's controller sheds
what it predicts cannot make it, `shed = drop`) -- and every request must get a terminal
answer (none lost). Prints one row per layout and the ratio to the best baseline, with
what starvation would show: the p99 TTFT of the requests served, and the longest any
request waited for its first answer (first token or drop) in multiples of its TTFT
target; and the share of offloaded requests that met their SLO.

    python -m bench.studies.overload [--qps 15] [--minutes 10] [--seed 0] [--workers N]
        [--json OUT]
"""
from __future__ import annotations

import argparse

import msgspec

from bench.json_file import write_json
from bench.loadgen.workloads import build_requests, workload
from bench.parallel import add_workers_flag, run_parallel
from bench.records import RunResult
from bench.results import is_good
from bench.ruler.ruler import RulerConfig, Subject, sim_config
from bench.sim.simulate import simulate
from daemon.core.controller_config import ControllerConfig
from engines.modes import BASELINES as BASELINE_MODES
from engines.scheduler_config import SchedulerConfig

BASELINES = tuple(f"3x{mode}" for mode in BASELINE_MODES)


class OverloadRow(msgspec.Struct, kw_only=True):
    layout: str
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


def overload_row(layout: str, r: RunResult, best: int) -> OverloadRow:
    records = r.records or []
    waits = [w / r.ttft_slo_s for w in (x.answer_wait() for x in records) if w is not None]
    moved = [x for x in records if x.offloaded]
    return OverloadRow(
        layout=layout, requests=r.num_requests, within_slo=r.good, goodput_pct=r.goodput_pct,
        completed=r.completed, dropped=r.dropped, errored=r.errored, lost=r.lost,
        ratio_to_best_baseline=round(r.good / best, 3) if best else None,
        p99_ttft_s=r.ttft_s.p99, max_wait_slo_multiple=round(max(waits, default=0.0), 2),
        offloaded=len(moved),
        offloaded_within_slo=sum(is_good(x, r.ttft_slo_s, r.tbt_slo_s) for x in moved))


def _run(job) -> tuple[str, object]:
    layout, qps, n, seed = job
    baseline = layout in BASELINES
    subject = Subject(label=layout, layout=layout,
                      scheduler=SchedulerConfig(drop_expired=baseline))
    config = RulerConfig(controller=ControllerConfig(shed="drop"))
    requests = build_requests(workload("poisson"), rate=qps, num_requests=n, seed=seed,
                              max_model_len=config.max_model_len)
    return layout, simulate(sim_config(subject, config), requests, seed=seed,
                            config={"layout": layout, "qps": qps}, keep_records=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.overload", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qps", type=float, default=15.0)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layouts", default="2L1H," + ",".join(BASELINES))
    parser.add_argument("--json", help="write the rows (OverloadRow) here")
    add_workers_flag(parser)
    args = parser.parse_args(argv)
    n = round(args.qps * args.minutes * 60)
    layouts = args.layouts.split(",")
    print(f"overload: ShareGPT, Poisson {args.qps:g} QPS for {args.minutes:g} simulated "
          f"minutes ({n} requests), a100-llama3-8b, seed {args.seed}; drops on everywhere")
    results = dict(run_parallel(_run, [(layout, args.qps, n, args.seed) for layout in layouts],
                                args.workers))
    best = max((results[b].good for b in BASELINES if b in results), default=0)
    rows = [overload_row(layout, results[layout], best) for layout in layouts]
    print(f"{'layout':>10} {'within SLO':>11} {'share':>7} {'completed':>10} {'dropped':>8} "
          f"{'errored':>8} {'lost':>5} {'vs best':>8} {'p99 TTFT':>9} {'max wait':>9} "
          f"{'offloads met':>13}")
    for row in rows:
        ratio = f"{row.ratio_to_best_baseline:.2f}x" if row.ratio_to_best_baseline else "-"
        p99 = f"{row.p99_ttft_s:.2f} s" if row.p99_ttft_s is not None else "-"
        moved = f"{row.offloaded_within_slo}/{row.offloaded}" if row.offloaded else "-"
        print(f"{row.layout:>10} {row.within_slo:>11} {row.goodput_pct:>6.1f}% "
              f"{row.completed:>10} {row.dropped:>8} {row.errored:>8} {row.lost:>5} "
              f"{ratio:>8} {p99:>9} {row.max_wait_slo_multiple:>8.1f}x {moved:>13}")
    if args.json:
        write_json(args.json, {"qps": args.qps, "minutes": args.minutes, "seed": args.seed,
                               "rows": rows})
    return 0 if all(row.lost == 0 for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
