"""`ascendra bench`: the open-loop load generator (bench/loadgen/bench_cli.py) against a server."""
from __future__ import annotations

import argparse

from bench.loadgen.bench_cli import DESCRIPTION, add_bench_flags, run


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = DESCRIPTION
    add_bench_flags(p)
    p.set_defaults(run=run)
