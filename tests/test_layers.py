"""The shape of the code: imports point down, the cores stay sans-I/O, files stay small.

Layers: policies/, ipc/ <- engines/ <- daemon/ <- bench/ <- the command line (bench/cli.py).
The `*_cmd.py` modules bench/cli.py registers rank as their own package: a command may import
its own package and below, never a higher one, and only bench/cli.py names a command (as text,
imported when it runs: tests/test_cli_imports.py). A core (events in, actions out) imports no
event loop, socket, clock or OS module, and nothing of ours that does.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("policies", "ipc", "engines", "daemon", "bench")
RANK = {"policies": 0, "ipc": 0, "engines": 1, "daemon": 2, "bench": 3}
COMMAND_LINE = 4
#: What each bottom package may import of ours besides itself.
BOTTOM_ALLOWED = {"policies": set(), "ipc": set()}
#: The two sans-I/O cores. Every module of their own package that they import, however
#: indirectly, is part of them (found, not listed by hand: a list went stale).
CORE_ROOTS = ("daemon.core.controller_core", "engines.instance_core",
              "daemon.gateway_view")  # (a pure view of the core, read by /metrics and /health)
IO_MODULES = {"asyncio", "zmq", "aiohttp", "socket", "time", "os", "threading", "subprocess",
              "uvloop", "selectors"}
#: Never anywhere below a core, however indirectly.
LOOP_MODULES = {"asyncio", "zmq", "aiohttp", "socket", "uvloop", "selectors"}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _ours(names: set[str]) -> set[str]:
    return {n for n in names if n in MODULES}


def _rank(module: str) -> int:
    """A `*_cmd` module ranks as its package, so daemon/serve_cmd.py may not import bench."""
    if module == "bench.cli":
        return COMMAND_LINE
    return RANK[module.split(".")[0]]


def test_every_import_points_down():
    up = []
    for module, path in MODULES.items():
        for target in _ours(_imports(path)):
            if _rank(target) > _rank(module) or (target.endswith("_cmd") and module != "bench.cli"):
                up.append(f"{module} -> {target}")
    assert not up, "imports pointing up (or at a command module from below the CLI):\n" + \
        "\n".join(sorted(up))


def test_policies_and_ipc_import_nothing_of_ours_but_themselves():
    for module, path in MODULES.items():
        top = module.split(".")[0]
        if top in BOTTOM_ALLOWED:
            others = {t.split(".")[0] for t in _ours(_imports(path))} - {top}
            assert others <= BOTTOM_ALLOWED[top], f"{module} imports {others}"


def _closure(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(_ours(_imports(MODULES[name])))
    return seen


def _core_modules() -> list[str]:
    """The cores and the modules of their own package in their import closure."""
    found = set()
    for root in CORE_ROOTS:
        package = root.split(".")[0]
        found |= {m for m in _closure(root) if m == root or (
            package == "daemon" and m.startswith("daemon."))}
    return sorted(found)


CORES = _core_modules()


def test_the_cores_are_found_whole():
    for module in ("daemon.core.handoffs", "daemon.core.prefixes", "daemon.core.prefix_index",
                   "daemon.core.waiting_room", "daemon.core.recovery_plan", "engines.instance_core"):
        assert module in CORES


@pytest.mark.parametrize("module", CORES)
def test_a_core_does_no_io(module):
    direct = {n.split(".")[0] for n in _imports(MODULES[module])} & IO_MODULES
    assert not direct, f"{module} imports {direct}"
    for dependency in _closure(module):
        loops = {n.split(".")[0] for n in _imports(MODULES[dependency])} & LOOP_MODULES
        assert not loops, f"{module} depends on {dependency}, which imports {loops}"


def test_policies_are_pure():
    for module, path in MODULES.items():
        if module.startswith("policies"):
            direct = {n.split(".")[0] for n in _imports(path)} & IO_MODULES
            assert not direct, f"{module} imports {direct}"


def test_a_file_that_imports_up_is_caught(tmp_path):
    """The check itself works: an engines module importing the daemon is an upward import."""
    path = tmp_path / "bad.py"
    path.write_text("from daemon.core.controller_core import ControllerCore\n")
    assert "daemon.core.controller_core" in _ours(_imports(path))
    assert _rank("daemon.core.controller_core") > _rank("engines.scheduler")


def test_a_command_ranks_as_its_own_package():
    """daemon/serve_cmd.py importing bench would point up; bench_cmd importing daemon is fine."""
    assert _rank("bench.loadgen.loadgen") > _rank("daemon.serve_cmd")
    assert _rank("daemon.layout") <= _rank("bench.bench_cmd")
    assert _rank("bench.bench_cmd") < _rank("bench.cli")
