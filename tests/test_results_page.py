"""docs/results.md and docs/fairness.md: every table names the `ascendra` command that
regenerates it, and that command exists -- it parses as an `ascendra` verb with flags the
verb takes, or (a study not yet behind a verb) as `python -m bench.studies.X` with flags its
`main` takes (issue #63). `ascendra reproduce results`'s own tables
(bench/studies/results_tables.py) are each a command that parses, and render what they hold.

Covers: docs/results.md, docs/fairness.md, bench/studies/results_tables.py, bench/studies/results_run.py, bench/studies/results_studies.py.
"""
from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path

import msgspec
import pytest

from daemon.cli import build_parser, verb_parser
from bench.ruler.ruler import NEAR_GROWTH, START_GROWTH, SeedCapacity
from bench.studies.results_run import (
    assemble, capacity_parser, render, row_command, table_command,
)
from bench.studies.results_studies import StudyResult, render_study
from bench.studies.results_tables import QUICK, STUDIES, TABLES, Protocol

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


def _rendered(name: str) -> tuple[str, object]:
    table = TABLES[name]
    searches = {(row_command(row, QUICK, quick=True), 0): SeedCapacity(0, 5.0 + i, [], True,
                                                                       4.0 + i)
                for i, row in enumerate(table.groups[0].rows)}
    doc = assemble(msgspec.structs.replace(table, groups=table.groups[:1]), QUICK, searches,
                   True, "abc1234", "2026-11-28 20:00 UTC")
    return render(doc), doc


def test_a_table_renders_its_stamp_ratios_and_protocol():
    text, doc = _rendered("bursts")
    assert "2026-11-28 20:00 UTC" in text and "abc1234" in text
    assert "`ascendra reproduce results --table bursts --out DIR`" in text
    assert "Quick run" in text
    assert doc.groups[0].ratio == round(5.0 / 6.0, 3)  # 3A over the best baseline
    assert "| bursty-cv4 | 3A | 5.00 | 4.00 | 0.83x, 0.80x |" in text


def test_a_table_of_capacity_alone_shows_no_fair_capacity():
    text, doc = _rendered("roles")
    assert all("--fair-floor 0" in r.command for r in doc.groups[0].rows)
    assert doc.groups[0].ratio == round(5.0 / 8.0, 3)  # 3A over the best static split (3L0H)
    assert "| shifting | 3A | 5.00 | - | 0.625x, - |" in text
    note, table = text.index("not searched"), text.index("| group |")
    assert note < table and "|---|---|---|---|---|\n| shifting | 3A" in text  # one table


def test_a_row_starts_its_search_at_its_last_capacity_but_not_in_a_quick_run():
    row = TABLES["capacity"].groups[0].rows[0]
    full = capacity_parser().parse_args(shlex.split(row_command(row, Protocol()))[2:])
    assert full.start_qps == row.start and full.start_growth == NEAR_GROWTH
    quick = capacity_parser().parse_args(shlex.split(row_command(row, QUICK, quick=True))[2:])
    assert quick.start_qps is None and quick.start_growth == START_GROWTH


@pytest.mark.parametrize("name", STUDIES)
def test_each_study_table_is_a_command_and_so_is_its_study(name, monkeypatch):
    assert parse_error(table_command(name)) is None
    for quick in (False, True):
        assert parse_error(STUDIES[name].command(quick, "/tmp/x"), monkeypatch) is None


def _overload_row(layout, qps, good, quartiles):
    return {"layout": layout, "qps": qps, "good_per_s": good, "lost": 0,
            "quartile_goodput_pct": dict(zip("abcd", quartiles))}


def test_the_overload_table_sets_3a_beside_the_best_baseline_at_each_load():
    data = {"rates": [[9.47, 1.0], [28.41, 3.0]], "rows": [
        _overload_row("3A", 9.47, 9.26, [100, 100, 100, 91]),
        _overload_row("2L1H", 9.47, 9.5, [100, 100, 100, 99]),      # not a baseline
        _overload_row("3xsglang@4096+drops", 9.47, 8.92, [97, 97, 94, 89]),
        _overload_row("3xvllm-v0@8192+drops", 9.47, 8.5, [90, 90, 90, 90]),
        _overload_row("3A", 28.41, 17.87, [100, 95, 53, 6]),
        _overload_row("3xsglang@4096+drops", 28.41, 4.0, [30, 20, 10, 1]),
        _overload_row("3xvllm-v0@8192+drops", 28.41, 5.06, [37, 22, 11, 2])]}
    doc = StudyResult(name="overload", title="Overload", command=table_command("overload"),
                      study_command="python -m bench.studies.overload", commit="abc1234",
                      date="2026-11-28 23:00 UTC", quick=False, returncode=0,
                      data=msgspec.Raw(msgspec.json.encode(data)))
    text = render_study(doc)
    assert "abc1234" in text and "`ascendra reproduce results --table overload --out DIR`" in text
    assert ("| 1x (9.47) | 9.26 | 3xsglang@4096+drops 8.92 | 100 / 100 / 100 / 91 | "
            "97 / 97 / 94 / 89 |") in text
    assert "| 3x (28.41) | 17.87 | 3xvllm-v0@8192+drops 5.06 |" in text
    assert "Requests lost, every row: 0." in text


def test_a_study_that_failed_says_so_in_its_table():
    doc = StudyResult(name="live", title="Live", command=table_command("live"),
                      study_command="python -m bench.studies.live_check", commit="abc1234",
                      date="2026-11-28 23:00 UTC", quick=True, returncode=1,
                      data=msgspec.Raw(b"null"))
    text = render_study(doc)
    assert "exited with status 1" in text and "Quick run" in text


def test_a_run_started_again_on_the_same_commit_runs_only_the_searches_it_lacks(
        tmp_path, monkeypatch):
    import bench.studies.results_run as results_run
    ran = []

    def fake_search(job):
        ran.append(job)
        return SeedCapacity(job[1], 5.0, [], True, 4.0)

    monkeypatch.setattr(results_run, "search", fake_search)
    monkeypatch.setattr(results_run, "_commit", lambda: "abc1234")
    first = results_run.run_tables(["replay"], tmp_path, quick=True, workers=1)
    assert [p.name for p in first] == ["replay.md"] and len(ran) == 2
    again = results_run.run_tables(["replay", "prefix"], tmp_path, quick=True, workers=1)
    assert [p.name for p in again] == ["replay.md", "prefix.md"]
    assert len(ran) == 4 and all("multi-turn" in cmd for cmd, _ in ran[2:])  # prefix's only
    monkeypatch.setattr(results_run, "_commit", lambda: "def5678")    # another tree: all again
    results_run.run_tables(["replay"], tmp_path, quick=True, workers=1)
    assert len(ran) == 6
