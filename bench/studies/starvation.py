"""Starvation check: does Ascendra's reordering and shedding make some requests wait far
longer than a baseline would? Per workload, Ascendra's layout and the best baseline run the
same requests at the same rate (by default the baseline's capacity), and the per-request
records (bench/records/records_report.py) give the p99 TTFT of the requests served and the longest
wait any request had for its first answer (first token, or its drop), in multiples of its
own TTFT target. Issue #14's bar: p99 TTFT no worse than the baseline's, and no wait over
`max_wait_slo_multiple` (10) targets.

    python -m bench.studies.starvation [--points poisson:8.6,bursty-cv4:1.65,...] [--json OUT]
        [--workers N]
"""
from __future__ import annotations

import argparse

import msgspec

from bench.json_file import write_json
from bench.loadgen.workloads import workload
from bench.parallel import add_workers_flag, run_parallel
from bench.records.records_report import report
from bench.ruler.ruler import RulerConfig, Subject, point_rows
from engines.scheduler_config import SchedulerConfig

#: The tuned baseline's capacity per workload (docs/figures/capacity.json, 3xvllm-v0 @ 8192).
DEFAULT_POINTS = "poisson:8.6,bursty-cv2:7.0,bursty-cv4:1.65,onoff:3.85,mixed-slo:8.45"
LAYOUTS = {"2L1H": SchedulerConfig(), "3xvllm-v0": SchedulerConfig(chunk_size=8192)}


class StarvationRow(msgspec.Struct, kw_only=True):
    workload: str
    qps: float
    layout: str
    goodput_pct: float
    p99_ttft_s: float | None
    max_wait_slo_multiple: float | None


def _run(job: tuple[str, float, str]) -> StarvationRow:
    name, qps, layout = job
    config = RulerConfig(workload=workload(name))
    subject = Subject(label=layout, layout=layout, scheduler=LAYOUTS[layout])
    summary = report(point_rows(subject, config, qps, config.seeds[0]))
    return StarvationRow(workload=name, qps=qps, layout=layout,
                         goodput_pct=round(summary.goodput_pct, 2), p99_ttft_s=summary.p99_ttft_s,
                         max_wait_slo_multiple=summary.max_wait_slo_multiple)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.starvation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", default=DEFAULT_POINTS, help="workload:qps,...")
    parser.add_argument("--json", help="write the rows (StarvationRow) here")
    add_workers_flag(parser)
    args = parser.parse_args(argv)
    jobs = [(name, float(qps), layout) for point in args.points.split(",")
            for name, qps in [point.split(":")] for layout in LAYOUTS]
    rows = run_parallel(_run, jobs, args.workers)
    print(f"{'workload':>11} {'qps':>5} {'layout':>7} {'goodput':>8} {'p99 TTFT':>9} "
          f"{'longest wait':>13}")
    for r in rows:
        p99 = "-" if r.p99_ttft_s is None else f"{r.p99_ttft_s:.2f} s"
        wait = "-" if r.max_wait_slo_multiple is None else f"{r.max_wait_slo_multiple:.1f}x"
        print(f"{r.workload:>11} {r.qps:>5g} {r.layout:>7} {r.goodput_pct:>7.1f}% {p99:>9} "
              f"{wait:>13}")
    if args.json:
        write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
