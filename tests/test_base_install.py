"""Every command the README says needs only the base install runs there (issue #62: `records`
once imported `rich`, which only the `bench` extra installs, and no test saw it because the
`test` extra pulls `rich` in).

A fresh venv with only `pip install -e .` per run would take minutes; instead each command
runs in a subprocess where every module that only the extras install cannot be imported
(a `sitecustomize` on PYTHONPATH marks them missing in `sys.modules`, so an import raises
ModuleNotFoundError and `importlib.util.find_spec` answers None, as for a package not
installed). Which modules those are is
derived, not listed by hand: the distributions the extras of setup.cfg pull in, minus all
that `install_requires` pulls in (tokenizers brings tqdm and pyyaml, so those stay), mapped
to their top-level modules by importlib.metadata. The daemon's instance processes inherit
the environment, so they are held to it too.

Covers: daemon/cli.py, bench/records/text_table.py.
"""
from __future__ import annotations

import configparser
import importlib.util
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.daemon_fixture import daemon_env, start_daemon

ROOT = Path(__file__).resolve().parent.parent

BLOCKER = """\
# What only the extras install cannot be imported here, as on a base install: a None in
# sys.modules makes `import NAME` raise ModuleNotFoundError and importlib.util.find_spec
# answer None (libraries probe optional packages that way).
import sys
for name in {blocked!r}:
    sys.modules.setdefault(name, None)
"""


def _requirements() -> tuple[list[str], dict[str, list[str]]]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")

    def lines(text: str) -> list[str]:
        return [line.split("#")[0].strip() for line in text.splitlines()
                if line.split("#")[0].strip()]
    extras = {name: lines(text) for name, text in cfg["options.extras_require"].items()}
    return lines(cfg["options"]["install_requires"]), extras


def _closure(requirements: list[str]) -> set[str]:
    """The installed distributions these requirements pull in, transitively (normalized
    names; extras' own optional requirements left out)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = _normal(req.name)
        if name in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here (e.g. flash-attn): nothing to block
        seen.add(name)
        todo += [Requirement(r) for r in requires]
    return seen


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extras_only_modules() -> set[str]:
    base, extras = _requirements()
    in_base = _closure(base)
    extra_dists = set().union(*(_closure(reqs) for reqs in extras.values())) - in_base
    return {module for module, dists in metadata.packages_distributions().items()
            if dists and all(_normal(d) in extra_dists for d in dists)}


def readme_base_verbs() -> list[str]:
    """The verbs the README's extras section says need only the base install."""
    readme = (ROOT / "README.md").read_text()
    line = re.search(r"Everything else -- (.*?) --\s+needs only the base install", readme, re.S)
    assert line, "the README names the commands that need only the base install"
    return re.findall(r"`(\w[\w-]*)`", line.group(1))


@pytest.fixture(scope="module")
def base_env(tmp_path_factory, daemon_cache) -> dict[str, str]:
    blocked = extras_only_modules()
    site = tmp_path_factory.mktemp("base-install")
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=sorted(blocked)))
    return daemon_env(daemon_cache, {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])})


def _ascendra(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    done = subprocess.run([sys.executable, "-m", "daemon.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"ascendra {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_blocked_modules_are_the_extras_and_not_the_base():
    blocked = extras_only_modules()
    assert {"rich", "transformers", "pytest"} <= blocked
    if importlib.util.find_spec("matplotlib") is not None:  # the bench extra's, when installed
        assert "matplotlib" in blocked
    assert not {"torch", "tokenizers", "msgspec", "zmq", "aiohttp", "tqdm", "numpy"} & blocked


def test_the_blocker_fails_an_import_of_an_extra_as_a_missing_package_does(base_env):
    probe = "import tqdm\ntry:\n    import rich\nexcept ModuleNotFoundError:\n    print('no rich')"
    done = subprocess.run([sys.executable, "-c", probe], env=base_env, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip() == "no rich", done.stderr


@pytest.mark.slow
def test_every_base_install_command_of_the_readme_runs_without_the_extras(
        base_env, tmp_path, daemon_cache):
    verbs = readme_base_verbs()
    assert verbs == ["serve", "generate", "bench", "simulate", "capacity", "plan", "records",
                     "chaos"]
    ran = []
    records = tmp_path / "sim.jsonl"
    _ascendra(base_env, "simulate", "--layout", "2L1H", "--workload", "poisson", "--qps", "6",
              "--num-requests", "40", "--records", str(records))
    assert "requests" in _ascendra(base_env, "records", str(records))
    ran += ["simulate", "records"]
    _ascendra(base_env, "capacity", "--layout", "1A", "--workload", "poisson", "--seeds", "0",
              "--measured", "40")
    _ascendra(base_env, "plan", "--gpus", "1", "--workload", "poisson", "--measured", "40",
              "--quick")
    ran += ["capacity", "plan"]
    assert _ascendra(base_env, "generate", "--prompt", "Hello", "--max-tokens", "4").strip()
    ran.append("generate")
    daemon = start_daemon(tmp_path, "--device", "cpu", "--num-kv-blocks", "512",
                          cache_dir=daemon_cache, env={"PYTHONPATH": base_env["PYTHONPATH"]})
    try:
        served = tmp_path / "bench.jsonl"
        _ascendra(base_env, "bench", "--url", daemon.base_url, "--num-requests", "4", "--qps", "4",
                  "--records", str(served))
        assert "4 requests" in _ascendra(base_env, "records", str(served))
    finally:
        daemon.stop()
    ran += ["serve", "bench"]
    _ascendra(base_env, "chaos", "--duration", "3", "--qps", "4")
    ran.append("chaos")
    assert sorted(ran) == sorted(verbs)
