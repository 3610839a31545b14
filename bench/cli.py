"""`ascendra` command line: one subcommand per job -- the top of the import graph.

The daemon's own verbs (serve, generate, make-tiny-model) live in `daemon/*_cmd.py`, the
evidence verbs (bench, simulate, capacity, records, reproduce, chaos) in `bench/*_cmd.py`;
only this file imports them.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import sys

from bench import bench_cmd, chaos_cmd, plan_cmd, records_cmd, reproduce_cmd, simulate_cmd
from daemon import generate_cmd, serve_cmd, tiny_model_cmd


def version() -> str:
    """The installed package's version (setup.cfg's, from its metadata)."""
    try:
        return importlib.metadata.version("ascendra")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ascendra", description="Ascendra LLM serving daemon")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (serve_cmd, generate_cmd, bench_cmd, simulate_cmd, plan_cmd, records_cmd,
                   reproduce_cmd, chaos_cmd, tiny_model_cmd):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except (ValueError, FileNotFoundError) as exc:
        print(f"ascendra {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
