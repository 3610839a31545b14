"""docs/results.md and docs/fairness.md: every table names the `ascendra` command that
regenerates it, and that command exists -- it parses as an `ascendra` verb with flags the
verb takes, or (a study not yet behind a verb) as `python -m bench.studies.X` with flags its
`main` takes (issue #63). `ascendra reproduce results`'s own tables
(bench/studies/results_tables.py) are each a command that parses, and render what they hold.

Covers: docs/results.md, docs/fairness.md, bench/studies/results_tables.py, bench/studies/results_run.py.
"""
from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path

import pytest

from daemon.cli import build_parser, verb_parser
from bench.ruler.ruler import SeedCapacity
from bench.studies.results_run import (
    assemble, capacity_parser, render, row_command, table_command,
)
from bench.studies.results_tables import QUICK, TABLES

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("docs/results.md", "docs/fairness.md")
COMMAND = re.compile(r"`((?:ascendra|python -m bench\.[\w.]+) [^`]+)`")


def tables(page: str) -> list[tuple[int, str]]:
    """(line number, the text before it back to the previous table or heading) per table."""
    found, before, in_table = [], [], False
    for n, line in enumerate((ROOT / page).read_text().splitlines(), 1):
        if line.startswith("|"):
            if not in_table:
                found.append((n, "\n".join(before)))
            in_table = True
            continue
        if in_table or line.startswith("#"):
            before = []
        in_table = False
        before.append(line)
    return found


class _Parsed(Exception):
    """A study's `main` got as far as parsing its flags."""


def study_parse_error(module: str, words: list[str], monkeypatch) -> str | None:
    """Why `python -m module words` is not a command: its `main` is run until its parser
    has read the flags (argparse's parse_args, then stopped before any work)."""
    try:
        main = importlib.import_module(module).main
    except (ImportError, AttributeError):
        return f"no module {module} with a main()"
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        parse(self, args, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    try:
        main(words)
    except _Parsed:
        return None
    except SystemExit:
        return f"`python -m {module} {' '.join(words)}` does not parse"
    finally:
        monkeypatch.undo()
    return f"`python -m {module}` parsed no flags"


def parse_error(command: str, monkeypatch=None) -> str | None:
    """Why `command` (an `ascendra ...` or `python -m ...` line) is not a command, or None."""
    words = shlex.split(command.replace("\n", " "))
    if words[0] == "python":
        return study_parse_error(words[2], words[3:], monkeypatch)
    words = words[1:]
    parser = build_parser()
    try:
        args, extras = parser.parse_known_args(words)
    except SystemExit:
        return f"`{command}` does not parse"
    if extras:
        return f"`{command}`: {verb_parser(parser, args.command).prog} takes no {extras}"
    return None


@pytest.mark.parametrize("page", PAGES)
def test_every_table_names_the_command_that_regenerates_it(page):
    missing = [f"{page}:{n}" for n, before in tables(page) if not COMMAND.search(before)]
    assert not missing, ("tables with no `ascendra ...` command between them and the heading "
                         "or table before: " + ", ".join(missing))


@pytest.mark.parametrize("page", PAGES)
def test_every_command_a_table_names_exists(page, monkeypatch):
    errors = [f"{page}:{n}: {error}" for n, before in tables(page)
              for command in COMMAND.findall(before)
              if (error := parse_error(command, monkeypatch))]
    assert not errors, "\n".join(errors)


def test_a_wrong_command_is_caught(monkeypatch):
    assert parse_error("python -m bench.studies.overload --no-such-flag", monkeypatch)
    assert parse_error("python -m bench.studies.overload --loads 1,2", monkeypatch) is None
    assert parse_error("ascendra capacity --layout 3A --no-such-flag 1")
    assert parse_error("ascendra reproduce results --table no-such-table --out DIR")
    assert parse_error("ascendra capacity --layout 3A --workload shifting") is None


@pytest.mark.parametrize("name", TABLES)
def test_each_results_table_and_its_rows_are_commands(name):
    assert parse_error(table_command(name)) is None
    for group in TABLES[name].groups:
        for row in group.rows:
            command = row_command(row, TABLES[name].protocol)
            assert parse_error(command) is None
            capacity_parser().parse_args(shlex.split(command)[2:])  # the runner reads it too


def test_a_table_renders_its_stamp_ratios_and_protocol():
    table = TABLES["roles"]
    searches = {(row_command(row, QUICK), 0): SeedCapacity(0, 5.0 + i, [], True, 4.0 + i)
                for i, row in enumerate(table.groups[0].rows)}
    doc = assemble(table, QUICK, searches, True, "abc1234", "2026-11-28 20:00 UTC")
    text = render(doc)
    assert "2026-11-28 20:00 UTC" in text and "abc1234" in text
    assert "`ascendra reproduce results --table roles --out DIR`" in text
    assert "Quick run" in text
    assert doc.groups[0].ratio == round(5.0 / 8.0, 3)  # 3A over the best static split (3L0H)
    assert "| shifting | 3A | 5.00 | 4.00 | 0.62x, 0.57x |" in text
