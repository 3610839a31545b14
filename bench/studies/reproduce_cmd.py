"""`ascendra reproduce FIGURE`: the paper's evaluation figures from the simulator, and
`ascendra reproduce results`: docs/results.md's tables (bench/studies/results_run.py)."""
from __future__ import annotations

import argparse
import sys

from bench.parallel import add_workers_flag
from bench.studies.reproduce import FIGURES
from bench.studies.results_tables import STUDIES, TABLES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Simulate one of the paper's evaluation figures and write FIGURE.json and "
                     "FIGURE.png into --out. fig9: goodput vs QPS and vs SLO scale; fig10: per "
                     "instance P99 TTFT, mean TBT, throughput, scheduling delay; fig11: EDF vs "
                     "SJF vs FCFS and HP elastic batch on/off; fig12: overload for 10 simulated "
                     "minutes with drops; fig13: 1L1H and 2L1H vs 1L2H; threshold: offload "
                     "threshold sweep; fleet: 1, 4 and 16 boxes behind an inference gateway, "
                     "by load. results: docs/results.md's tables (every one, or --table), each "
                     "as NAME.json and NAME.md, stamped with the commit and date.")
    p.add_argument("figure", choices=[*FIGURES, "all", "results"])
    p.add_argument("--out", default="results", help="output folder (default ./results)")
    p.add_argument("--num-requests", type=int, default=None,
                   help="requests per simulated point (default: per figure, a few minutes)")
    p.add_argument("--quick", action="store_true", help="fewer points and requests: a smoke test")
    p.add_argument("--table", action="append", choices=[*STUDIES, *TABLES], default=None,
                   help="results: only this table (repeatable; default: every table)")
    p.add_argument("--seeds", default=None,
                   help="results: comma-separated seeds instead of each table's own (a "
                        "reduced run, labelled so in its markdown)")
    p.add_argument("--measured", type=int, default=None,
                   help="results: measured requests per point instead of each table's own "
                        "(a reduced run, labelled so)")
    p.add_argument("--profile", default=None, metavar="FILE|NAME",
                   help="results: the tables on this profile (a file `ascendra profile` wrote, "
                        "or a built-in name) instead of a100-llama3-8b: its own SLOs "
                        "(--slo-scale auto), every fixed rate scaled by its poisson ShareGPT "
                        "ceiling over a100-llama3-8b's, each table stamped with it "
                        "(bench/studies/results_profile.py)")
    add_workers_flag(p)
    p.set_defaults(run=run_reproduce)


#: The one line `reproduce` prints when the figures' plotting library is missing.
MISSING_BENCH_EXTRA = ("ascendra reproduce: error: the figures need matplotlib, which is in the "
                       "`bench` extra: pip install -e '.[bench]'")


def run_reproduce(args: argparse.Namespace) -> int:
    if args.figure == "results":
        return run_results(args)
    if args.profile:
        print("ascendra reproduce: error: --profile: only `reproduce results` takes it (the "
              "figures are the paper's, on a100-llama3-8b)", file=sys.stderr)
        return 2
    try:  # checked before simulating anything: the PNGs come last
        import matplotlib  # noqa: F401
    except ImportError:
        print(MISSING_BENCH_EXTRA, file=sys.stderr)
        return 1
    from bench.studies.reproduce import reproduce

    figures = FIGURES if args.figure == "all" else (args.figure,)
    for figure in figures:
        json_path, png_path = reproduce(
            figure, args.out, num_requests=args.num_requests, quick=args.quick,
            workers=args.workers, progress=lambda line: print(line, file=sys.stderr))
        print(f"{figure}: wrote {json_path} and {png_path}")
    return 0


def run_results(args: argparse.Namespace) -> int:
    from bench.studies.results_run import run_tables

    seeds = [int(s) for s in args.seeds.split(",") if s.strip()] if args.seeds else None
    target = None
    if args.profile:
        from bench.studies.results_profile import profile_target
        try:
            target = profile_target(args.profile)
        except ValueError as exc:  # unreadable, malformed, or no rate fits it
            print(f"ascendra reproduce: error: --profile: {exc}", file=sys.stderr)
            return 2
    for path in run_tables(args.table or [*STUDIES, *TABLES], args.out, quick=args.quick,
                           seeds=seeds, measured=args.measured, workers=args.workers,
                           progress=lambda line: print(line, file=sys.stderr), target=target):
        print(f"wrote {path} and {path.with_suffix('.json')}")
    return 0
