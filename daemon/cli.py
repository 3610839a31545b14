"""`ascendra` command line: one subcommand per job."""
from __future__ import annotations

import argparse
import sys

from daemon import (bench_cmd, chaos_cmd, generate_cmd, reproduce_cmd, serve_cmd, simulate_cmd,
                    tiny_model_cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ascendra", description="Ascendra LLM serving daemon")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (serve_cmd, generate_cmd, bench_cmd, simulate_cmd, reproduce_cmd, chaos_cmd,
                   tiny_model_cmd):
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
