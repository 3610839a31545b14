"""docs/ARCHITECTURE.md and docs/design.md name what exists: every module, class, function
and file they put in code font is in the tree (issue #54 §5).

A code span is checked when it looks like a name in the code:

* a path (`daemon/core/waiting_room.py`, `bench/ruler/`): the file or folder exists;
* a dotted name (`policies.roles`, `Origin.OFFLOAD`, `InstanceCore.begin_step`): either
  an importable module and attributes under it, or a class defined in the tree that
  defines (or inherits from a class in the tree that defines) the attribute;
* a call (`seed_capacity()`, `accept(request)`): the function name, as a plain name;
* a plain name (`WaitingRoom`, `bind_steps`, `slack`): something the tree defines with
  that name -- a class, a function, a parameter, an assigned name or struct field -- or
  a string constant in the code (a setting's value, an error code, a metric name).

Anything else in code font (flags, commands, HTTP paths, numbers, expressions) is prose
about using the code, not a name in it, and is left alone. `NOT_CODE` is the short list
of names in code font that are deliberately not the tree's own.

Covers: docs/ARCHITECTURE.md, docs/design.md.
"""
from __future__ import annotations

import ast
import functools
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("docs/ARCHITECTURE.md", "docs/design.md")
PACKAGES = ("daemon", "engines", "ipc", "policies", "bench", "tests")

#: Names in code font that are not the tree's: other systems' names, and shell words.
NOT_CODE = {
    "Connection", "EngineCore",  # h11's and vLLM's sans-I/O cores, the pattern ours follow
    "max_num_batched_tokens",  # vLLM's name for the token budget (ours: chunk_size)
    "schedule",                # Sarathi-Serve's / vLLM's scheduler entry point, compared with
    "pip",
}

SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
#: A span right after "was" is a former name (design.md's glossary): not the tree's any more.
FORMER = re.compile(r"\bwas\s+$")
PATH = re.compile(r"^[\w.-]+(/[\w.-]+)*/?$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
CALL = re.compile(r"^([A-Za-z_][\w.]*)\([^()]*\)$")
NAME = re.compile(r"^[A-Za-z_]\w*$")


class Index:
    """What the tree defines: names, string constants, and each class's attributes."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.strings: set[str] = set()
        self.classes: dict[str, set[str]] = {}
        self.bases: dict[str, set[str]] = {}
        self.homes: dict[str, set[str]] = {}   # a top-level class or function -> its files
        for package in PACKAGES:
            for path in (ROOT / package).rglob("*.py"):
                if path.name == Path(__file__).name:  # its own examples of stale names
                    continue
                tree = ast.parse(path.read_text(), str(path))
                for node in tree.body if package != "tests" else ():
                    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.homes.setdefault(node.name, set()).add(
                            path.relative_to(ROOT).as_posix())
                self._read(tree)
        self.names |= {p.stem for p in ROOT.rglob("*.py") if ".venv" not in p.parts}

    def _read(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                self.names.add(node.name)
                attrs = self.classes.setdefault(node.name, set())
                self.bases.setdefault(node.name, set()).update(
                    b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                    for b in node.bases)
                for item in ast.walk(node):
                    attrs.update(_defined(item))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.names.add(node.name)
                self.names.update(a.arg for a in (*node.args.args, *node.args.kwonlyargs))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if len(node.value) < 80:
                    self.strings.add(node.value)
            else:
                self.names.update(_defined(node))

    def has_attr(self, cls: str, attr: str, seen: frozenset = frozenset()) -> bool:
        if attr in self.classes.get(cls, ()):
            return True
        return any(self.has_attr(b, attr, seen | {cls}) for b in self.bases.get(cls, ())
                   if b not in seen)


def _defined(node: ast.AST) -> set[str]:
    """The names `node` defines (not those it only reads)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.AnnAssign):
        return _targets(node.target)
    if isinstance(node, ast.Assign):
        return set().union(*(_targets(t) for t in node.targets))
    if isinstance(node, ast.keyword) and node.arg:
        return {node.arg}
    return set()


def _targets(target: ast.AST) -> set[str]:
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Attribute):  # self.x = ...
        return {target.attr}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_targets(t) for t in target.elts))
    return set()


@functools.cache
def index() -> Index:
    return Index()


def resolves(name: str) -> bool:
    """Whether the code-font `name` names something in the tree (or is not a name)."""
    name = name.strip()
    if name in NOT_CODE:
        return True
    call = CALL.match(name)
    if call:
        name = call.group(1)
    if "/" in name and PATH.match(name):
        return (ROOT / name).exists() or (ROOT / "docs" / name).exists()
    if DOTTED.match(name):
        return _dotted(name)
    if NAME.match(name):
        if name.startswith("ascendra_") and name.endswith("_total"):  # a counter's series
            name = name[:-len("_total")]
        return name in index().names or name in index().strings
    return True  # not a name: a flag, a command, an expression


def _dotted(name: str) -> bool:
    parts = name.split(".")
    if parts[-1] in ("py", "md", "toml", "cfg", "json"):  # a file name
        return any(ROOT.rglob(name))
    for cut in range(len(parts), 0, -1):  # the longest importable module prefix
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            break
        return True
    head, *rest = parts
    if head in index().classes and len(rest) == 1:
        return index().has_attr(head, rest[0])
    # `x.attr` on an instance (`self.engine`, `args.layout`): the attribute is defined
    return all(p in index().names or p in index().strings for p in rest)


#: "`Roles` (roles.py" or "`Roles` (daemon/core/role_switch.py": where a doc says a name lives.
PLACED = re.compile(r"`([A-Za-z_]\w*)` \(([\w/]+\.py)")


def misplaced(doc: str) -> list[str]:
    """"`Name` (file.py ...)" where no file of that name defines Name at its top level."""
    text = (ROOT / doc).read_text()
    return [f"{doc}: `{name}` ({file}): defined in {sorted(index().homes.get(name, ())) or 'no file'}"
            for name, file in PLACED.findall(text)
            if name in index().homes and not any(
                home == file or home.endswith("/" + file) for home in index().homes[name])]


def spans(doc: str) -> list[tuple[int, str]]:
    text = (ROOT / doc).read_text()
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return [(n, m.group(1)) for n, line in enumerate(text.splitlines(), 1)
            for m in SPAN.finditer(line) if not FORMER.search(line[:m.start()])]


@pytest.mark.parametrize("doc", DOCS)
def test_every_name_in_code_font_exists(doc):
    stale = [f"{doc}:{line}: `{name}`" for line, name in spans(doc) if not resolves(name)]
    assert not stale, ("names in code font that the tree does not define (rename them in "
                       "the doc, or the code):\n  " + "\n  ".join(stale))


@pytest.mark.parametrize("doc", DOCS)
def test_every_name_placed_in_a_file_is_defined_there(doc):
    wrong = misplaced(doc)
    assert not wrong, "names the doc places in the wrong file:\n  " + "\n  ".join(wrong)


def test_the_check_catches_a_stale_name():
    assert not resolves("policies/no_such_module.py")
    assert not resolves("NoSuchClassAnywhere")
    assert not resolves("WaitingRoom.no_such_method")
    assert not resolves("daemon.core.no_such_module")
    assert resolves("daemon/core/waiting_room.py")
    assert resolves("WaitingRoom")
