"""The command line loads only the verb it runs: daemon/cli.py names each verb's module as
text (`VERBS`) and imports it when that verb is chosen, so `ascendra serve` loads the
daemon and nothing of bench/ -- no simulator, load generator, study or figures.

The module sets are taken in a fresh interpreter: this one has imported everything.

Covers: daemon/cli.py.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.cli import VERBS, build_parser, verb_parser

ROOT = Path(__file__).resolve().parent.parent
OURS = ("bench", "daemon", "engines", "ipc", "policies")
#: Parse `ascendra ARGS` (a --help exits) and write the project's loaded modules to OUT.
PROBE = """
import json, sys
from daemon.cli import build_parser
out, argv = sys.argv[1], sys.argv[2:]
try:
    build_parser().parse_args(argv)
except SystemExit:
    pass
with open(out, "w") as f:
    json.dump(sorted(m for m in sys.modules if m.split(".")[0] in {ours!r}), f)
""".format(ours=OURS)


def _loaded(tmp_path: Path, *argv: str) -> set[str]:
    out = tmp_path / "modules.json"
    subprocess.run([sys.executable, "-c", PROBE, str(out), *argv], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, timeout=60)
    return set(json.loads(out.read_text()))


@pytest.mark.slow
def test_serve_loads_no_bench_module(tmp_path):
    loaded = _loaded(tmp_path, "serve")
    assert not {m for m in loaded if m.split(".")[0] == "bench"}, loaded
    assert {"daemon.serve_cmd", "daemon.controller", "daemon.api"} <= loaded


def test_the_verb_list_loads_no_verb(tmp_path):
    loaded = _loaded(tmp_path, "--help")
    assert not {m for m in loaded if m.endswith("_cmd")}, loaded
    assert not {m for m in loaded if m.split(".")[0] in ("bench", "engines")}, loaded
    assert {m for m in loaded if m.split(".")[0] == "daemon"} == {"daemon", "daemon.cli"}


def test_a_verbs_help_loads_that_verb_only(tmp_path):
    commands = {m for m in _loaded(tmp_path, "records", "--help") if m.endswith("_cmd")}
    assert commands == {"bench.records.records_cmd"}


@pytest.mark.parametrize("verb", [v.name for v in VERBS])
def test_every_verb_resolves_to_a_command_module_that_sets_its_run(verb):
    target = next(v.arguments for v in VERBS if v.name == verb)
    assert target.split(":")[0].endswith("_cmd"), target  # tests/test_layers.py ranks these
    parser = verb_parser(build_parser(), verb)
    assert callable(parser.get_default("run"))
    assert parser.prog == f"ascendra {verb}"
