"""The shape of the code: imports point down, the cores stay sans-I/O, each file says its idea.

Layers: policies/, ipc/ <- engines/ <- daemon/ <- bench/ <- the command line. The command
line is the product's (daemon/cli.py, the `ascendra` entry point) and ranks as daemon/: what
it imports, it imports from daemon/ and below. It reaches bench/ only by name: its verb
table (`VERBS`) holds each verb's "module:function" as text, imported when that verb runs
(tests/test_cli_imports.py), so no import of bench/ points up from it. The `*_cmd.py`
modules it names rank as their own package: a command may import its own package and
below, never a higher one, and nothing imports a command (only the CLI names one, as text).
A core (events in, actions out) imports no event loop, socket, clock or OS module, and
nothing of ours that does: the controller core is its folder, daemon/core/ (which imports
nothing else of daemon/), the instance core the modules of engines.instance_core's import
closure. A file holds one idea, which its module docstring states (there is no line cap: a
file's length follows its idea, STYLE.md).

Covers: daemon/, engines/, ipc/, policies/, bench/.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("policies", "ipc", "engines", "daemon", "bench")
RANK = {"policies": 0, "ipc": 0, "engines": 1, "daemon": 2, "bench": 3}
#: The `ascendra` command line: it names the verbs' modules as text, imports none of them.
CLI = "daemon.cli"
#: What each bottom package may import of ours besides itself.
BOTTOM_ALLOWED = {"policies": set(), "ipc": set()}
#: The controller core: every module in this folder.
CORE_FOLDER = "daemon.core"
#: The instance core, and a pure view of the controller core (read by /metrics and /health):
#: each with every module of daemon/ it imports, however indirectly (found, not listed by
#: hand: a list went stale).
CORE_ROOTS = ("engines.instance_core", "daemon.gateway_view")
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


@functools.cache  # every test reads the same files: each parsed once a run
def _imports(path: Path) -> frozenset[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return frozenset(names)


def _ours(names: frozenset[str]) -> set[str]:
    return {n for n in names if n in MODULES}


def _rank(module: str) -> int:
    """A module ranks as its top package: a `*_cmd` too (daemon/serve_cmd.py may not import
    bench), and the command line (daemon/cli.py may not import bench: it names it)."""
    return RANK[module.split(".")[0]]


def test_every_import_points_down():
    up = []
    for module, path in MODULES.items():
        for target in _ours(_imports(path)):
            if _rank(target) > _rank(module) or target.endswith("_cmd"):
                up.append(f"{module} -> {target}")
    assert not up, "imports pointing up (or at a command module, which only the CLI names):\n" + \
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


def _in_core_folder(module: str) -> bool:
    return module == CORE_FOLDER or module.startswith(CORE_FOLDER + ".")


def _core_modules() -> list[str]:
    """Every module of the controller core's folder, the roots, and the daemon modules in
    the roots' import closure."""
    found = {m for m in MODULES if _in_core_folder(m)}
    for root in CORE_ROOTS:
        found |= {m for m in _closure(root) if m == root or m.startswith("daemon.")}
    return sorted(found)


CORES = _core_modules()


def test_the_cores_are_found_whole():
    for module in ("daemon.core.controller_core", "daemon.core.ledger",
                   "daemon.core.core_view", "daemon.core.recovery",
                   "daemon.core.recovery_plan", "daemon.core.handoffs", "daemon.core.backlogs",
                   "daemon.core.prefix_index", "daemon.core.waiting_room",
                   "daemon.core.admission_bounds", "daemon.core.request_state",
                   "daemon.core.events", "daemon.core.controller_config",
                   "engines.instance_core", "daemon.gateway_view"):
        assert module in CORES


def test_the_controller_core_imports_nothing_else_of_the_daemon():
    """daemon/core/ is the controller core whole: nothing in it reaches out of the folder
    into daemon/ (what the core needs lives in it; the daemon's I/O never does)."""
    for module in MODULES:
        if _in_core_folder(module):
            outside = {t for t in _ours(_imports(MODULES[module]))
                       if t.startswith("daemon.") and not _in_core_folder(t)}
            assert not outside, f"{module} imports {outside}"


@pytest.mark.parametrize("module", CORES)
def test_a_core_does_no_io(module):
    direct = {n.split(".")[0] for n in _imports(MODULES[module])} & IO_MODULES
    assert not direct, f"{module} imports {direct}"
    for dependency in _closure(module):
        loops = {n.split(".")[0] for n in _imports(MODULES[dependency])} & LOOP_MODULES
        assert not loops, f"{module} depends on {dependency}, which imports {loops}"


#: What the controller core's ledger may import of the core: its own structures, no other
#: component (the core tells the waiting room and the prefix index of its sends and ends).
LEDGER_MAY_IMPORT = {"daemon.core.admission_bounds", "daemon.core.controller_config",
                     "daemon.core.events", "daemon.core.request_state"}


def test_the_ledger_imports_no_other_component():
    imported = {m for m in _ours(_imports(MODULES["daemon.core.ledger"]))
                if m.startswith(CORE_FOLDER)}
    assert imported <= LEDGER_MAY_IMPORT, imported - LEDGER_MAY_IMPORT


#: A controller core's components, as its attributes: code outside daemon/core/ that names
#: one on a core reaches past its view (daemon/core/core_view.py).
CORE_PARTS = r"(?<!daemon\.)\b(?:core|controller)\.(?:ledger|room|router|roles|recovery|handoffs|prefix_index)\b"


def test_outside_the_controller_core_only_its_view_is_read():
    """The daemon's driver, /health, /metrics, the gateway gauges and bench read a
    controller core through `CoreView` (`core.view`), never through its components."""
    reaching = [f"{name}: {match.group()}" for name, path in _modules().items()
                if name.split(".")[0] in ("daemon", "bench") and not name.startswith(CORE_FOLDER)
                for match in re.finditer(CORE_PARTS, path.read_text())]
    assert reaching == []


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
    assert _rank("daemon.layout") <= _rank("bench.loadgen.bench_cmd")


def test_the_command_line_reaches_bench_by_name_only():
    """daemon/cli.py imports nothing of bench/ (that would point up); each verb it names is a
    real `*_cmd` module of ours, given as text."""
    from daemon.cli import VERBS

    assert _rank("bench.sim.simulate_cmd") > _rank(CLI)
    assert not {t for t in _ours(_imports(MODULES[CLI])) if t.startswith("bench")}
    for verb in VERBS:
        module = verb.arguments.split(":")[0]
        assert module in MODULES and module.endswith("_cmd"), verb


def test_every_module_states_its_idea():
    """Each module of ours opens with a docstring: the one idea the file holds."""
    silent = [str(path.relative_to(ROOT)) for path in MODULES.values()
              if path.read_text().strip() and ast.get_docstring(ast.parse(path.read_text())) is None]
    assert not silent, f"modules without a docstring saying what they hold: {silent}"
