"""`ascendra` command line: one subcommand per job -- the top of the import graph.

The product's entry point (setup.cfg: `ascendra = daemon.cli:main`). The daemon's own verbs
(serve, generate, make-tiny-model) live in `daemon/*_cmd.py`; the evidence verbs each in
bench/ beside what they run (bench/loadgen/bench_cmd.py, bench/profiling/profile_cmd.py (it
starts a daemon and loads it), bench/sim/simulate_cmd.py for
simulate and capacity, bench/ruler/plan_cmd.py, bench/records/records_cmd.py,
bench/studies/reproduce_cmd.py, bench/chaos/chaos_cmd.py). Only this file names them, as
text (`VERBS`), and it imports a verb's module only when that verb runs or its `--help` is
asked for: this module imports nothing of bench/ (bench/ sits above the daemon), and
`ascendra serve` loads the daemon and nothing of bench/ -- no simulator, load generator,
study or figure (tests/test_cli_imports.py, tests/test_layers.py check it).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Callable
from typing import NamedTuple


class Verb(NamedTuple):
    name: str
    help: str          # its line in `ascendra --help`
    #: "module:function" that adds the verb's flags (and description) to its parser and
    #: sets its `run`; imported only when the verb is chosen.
    arguments: str


VERBS: tuple[Verb, ...] = (
    Verb("serve", "run the daemon: OpenAI-compatible HTTP API over engine instances",
         "daemon.serve_cmd:add_arguments"),
    Verb("generate", "complete prompts offline (continuous batching, one instance)",
         "daemon.generate_cmd:add_arguments"),
    Verb("profile", "time this machine's executor over a grid of steps: a profile file for "
                    "simulate/capacity/plan --profile FILE; --compare two profiles",
         "bench.profiling.profile_cmd:add_arguments"),
    Verb("bench", "load-test a server: open-loop arrivals from a trace, TTFT/TBT "
                  "percentiles, goodput", "bench.loadgen.bench_cmd:add_arguments"),
    Verb("simulate", "simulate a layout on a GPU profile (virtual clock)",
         "bench.sim.simulate_cmd:add_simulate_arguments"),
    Verb("capacity", "highest QPS holding a goodput target in steady state, by simulation "
                     "(several seeds)", "bench.sim.simulate_cmd:add_capacity_arguments"),
    Verb("plan", "simulate every split of --gpus GPUs (all-LP, kLmH, baselines) on a "
                 "workload and recommend one", "bench.ruler.plan_cmd:add_arguments"),
    Verb("records", "goodput by class, prompt length, instance and offload of a records "
                    "file, and why requests missed", "bench.records.records_cmd:add_arguments"),
    Verb("reproduce", "the paper's figures 9-13 (and the offload-threshold sweep), simulated",
         "bench.studies.reproduce_cmd:add_arguments"),
    Verb("chaos", "start a daemon (sim executor), load it, inject faults (kill -9 LP and HP "
                  "instances, garbage frames, client disconnects, a burst, SIGTERM) and "
                  "tally every request's answer; exit 1 if any was lost",
         "bench.chaos.chaos_cmd:add_arguments"),
    Verb("make-tiny-model", "write a small random-weight Llama-family checkpoint in the "
                            "Hugging Face folder format", "daemon.tiny_model_cmd:add_arguments"),
)


def version() -> str:
    """The installed package's version (setup.cfg's, from its metadata)."""
    try:
        return importlib.metadata.version("ascendra")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def _function(target: str) -> Callable[[argparse.ArgumentParser], None]:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


class _LazyVerbs(argparse._SubParsersAction):
    """Subparsers that get their flags only when argparse dispatches to them."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.pending: dict[str, str] = {}

    def parser_for(self, name: str) -> argparse.ArgumentParser:
        """Verb `name`'s parser, its flags added (its module imported) on first use."""
        parser = self.choices[name]
        target = self.pending.pop(name, None)
        if target is not None:
            _function(target)(parser)
        return parser

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if values and values[0] in self.choices:
            self.parser_for(values[0])
        super().__call__(parser, namespace, values, option_string)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but an error is one short line and the last one, as git's are
    (`ascendra serve: error: ...; see ascendra serve --help`), not the usage's 30 lines
    above it. Verbs' parsers are of this class too (add_subparsers takes the parent's)."""

    def error(self, message: str):
        see = "" if "--help" in message else f"; see {self.prog} --help"
        self.exit(2, f"{self.prog}: error: {message}{see}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ascendra", description="Ascendra LLM serving daemon")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    parser.register("action", "parsers", _LazyVerbs)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for verb in VERBS:
        sub.add_parser(verb.name, help=verb.help)
        sub.pending[verb.name] = verb.arguments
    return parser


def verb_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of `build_parser()`'s verb `name`, with all its flags (for tests)."""
    return parser._subparsers._group_actions[0].parser_for(name)


def unrecognized(extras: list[str], verb: argparse.ArgumentParser) -> str:
    """The error for flags `verb` does not take, naming the closest flag it does take."""
    import difflib

    message = "unrecognized arguments: " + " ".join(extras)
    names = [flag[2:] for flag in verb._option_string_actions if flag.startswith("--")]
    for word in extras:
        if word.startswith("-"):
            close = difflib.get_close_matches(word.split("=", 1)[0].lstrip("-"), names, n=1,
                                              cutoff=0.7)
            if close:
                message += f" (did you mean --{close[0]}?)"
                break
    return message + f"; see {verb.prog} --help"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # a wrong flag: the verb's own usage and its closest flag, not the top level's
        verb = verb_parser(parser, args.command)
        verb.error(unrecognized(extras, verb))
    try:
        return args.run(args) or 0
    except (ValueError, FileNotFoundError) as exc:
        print(f"ascendra {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
