"""The tests' one rule for finding a module's tests: every test file's docstring ends with
a `Covers:` line naming, as paths from the repository root, the modules (or folders, or
files such as README.md) it tests -- so `grep -l "Covers:.*daemon/cli.py" tests/` finds
the tests of daemon/cli.py, and a file's path in a Covers line goes stale the moment the
file moves (this test fails).

Covers: tests/.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COVERS = re.compile(r"^Covers: (.+)\.$", re.M)
TEST_FILES = sorted((ROOT / "tests").glob("test_*.py"))


def covered(path: Path) -> list[str]:
    """The paths a test file's `Covers:` line names (none when it has no such line)."""
    found = COVERS.findall(ast.get_docstring(ast.parse(path.read_text())) or "")
    return [name.strip() for line in found for name in line.split(",")]


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_a_test_file_names_what_it_covers(path):
    names = covered(path)
    assert names, f"{path.name}: its docstring has no 'Covers: path, path.' line"
    missing = [name for name in names if not (ROOT / name.rstrip("/")).exists()]
    assert not missing, f"{path.name} covers paths that do not exist: {missing}"


def test_a_stale_or_missing_covers_line_is_caught(tmp_path):
    stale = tmp_path / "test_stale.py"
    stale.write_text('"""Old tests.\n\nCovers: bench/moved_away.py, daemon/cli.py.\n"""\n')
    assert covered(stale) == ["bench/moved_away.py", "daemon/cli.py"]
    assert not (ROOT / "bench/moved_away.py").exists()
    bare = tmp_path / "test_bare.py"
    bare.write_text('"""Tests of daemon/cli.py, named in prose only."""\n')
    assert covered(bare) == []
