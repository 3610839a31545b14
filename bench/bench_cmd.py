"""`ascendra bench`: the open-loop load generator (bench/bench_cli.py) against a server."""
from __future__ import annotations

import argparse

from bench.bench_cli import DESCRIPTION, add_bench_flags, run


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="load-test a server: open-loop arrivals from a trace, "
                                     "TTFT/TBT percentiles, goodput",
                       description=DESCRIPTION)
    add_bench_flags(p)
    p.set_defaults(run=run)
