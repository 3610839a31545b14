"""The packaged data tables (GPU operator tables, request-length traces, published reference
numbers): they load without ../shared, give the raw files' numbers where the raw files are
beside the checkout, and a copy of the repository with no ../shared passes its tests.

Covers: bench/data/, engines/executors/profiles/data.py, bench/loadgen/traces.py.
"""
from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.data import derive_profile_refs, derive_traces
from bench.data.profile_refs import REFS_FILE, from_readme, load_refs
from bench.loadgen.traces import ENV_VAR as TRACES_VAR
from bench.data.derive_traces import RAW_DEFAULT_DIR as RAW_TRACES
from bench.loadgen.trace_file import load_rows, load_trace
from bench.loadgen.traces import TRACE_DATA_DIR, TRACE_FILES, trace_file
from engines.executors.profiles import ENV_VAR as PROFILES_VAR
from engines.executors.profiles import derive_tables
from engines.executors.profiles.derive_tables import RAW_DEFAULT_DIR as RAW_PROFILES
from engines.executors.profiles.data import TABLES_DIR, op_file
from engines.executors.profiles.op_table import load_op_table, load_op_table_at

ROOT = Path(__file__).resolve().parent.parent
needs_raw_profiles = pytest.mark.skipif(
    not (RAW_PROFILES / "vidur").is_dir(), reason=f"no raw profiles at {RAW_PROFILES}")
needs_raw_traces = pytest.mark.skipif(
    not RAW_TRACES.is_dir(), reason=f"no raw traces at {RAW_TRACES}")


@pytest.fixture(autouse=True)
def _packaged(monkeypatch):
    """Every test starts reading the packaged tables (no override variable set)."""
    monkeypatch.delenv(PROFILES_VAR, raising=False)
    monkeypatch.delenv(TRACES_VAR, raising=False)


def _gunzip(path: Path) -> bytes:
    return gzip.decompress(path.read_bytes())


# ---- the packaged tables on their own -------------------------------------------------------
def test_packaged_tables_load_and_stay_small():
    for name in derive_tables.ops_files():
        assert op_file(name).parent == TABLES_DIR
        table = load_op_table(name)
        assert len(table.tokens) > 200 and table.tokens[0] == 1
        assert np.all(np.diff(table.tokens) > 0)
    assert len(load_trace("sharegpt")) == 30_731 and len(load_trace("arxiv")) == 28_257
    assert len(load_trace("azure-conv")) == 19_366
    assert trace_file("arxiv").parent == TRACE_DATA_DIR
    assert load_refs().prefill_chunk_range[0] == 64
    folders = (TABLES_DIR, TRACE_DATA_DIR, REFS_FILE.parent)
    # (600 kB since the tables hold Vidur's rows at tensor-parallel degrees 2, 4 and 8 and
    # the 70B models' and all-reduce tables: #55)
    assert sum(f.stat().st_size for d in folders for f in d.iterdir()) < 650_000
    assert all((d / "README.md").is_file() for d in folders)  # source, licence, derivation


def test_environment_variables_override_with_raw_folders(monkeypatch, tmp_path):
    (tmp_path / TRACE_FILES["sharegpt"]).write_text(
        "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n7,3,10,2.33\n")
    (tmp_path / TRACE_FILES["azure-conv"]).write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n")
    monkeypatch.setenv(TRACES_VAR, str(tmp_path))
    assert load_trace("sharegpt") == [(7, 3)]
    assert [r.arrival - 1700158546 for r in load_rows("azure-conv")] == pytest.approx(
        [0.68059, 4.995169])                                    # the raw file's own dates
    with pytest.raises(FileNotFoundError, match=TRACES_VAR) as info:
        load_trace("arxiv")
    assert str(tmp_path) in str(info.value)
    with pytest.raises(ValueError, match="sharegpt"):
        load_trace("nope")
    monkeypatch.setenv(PROFILES_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=PROFILES_VAR):
        load_op_table("a100_Llama-2-7b-hf_mlp.csv")


# ---- the same numbers as the raw files, where they are beside the checkout -----------------
@needs_raw_profiles
@pytest.mark.parametrize("name", derive_tables.ops_files())
def test_operator_tables_equal_the_raw_files(name):
    if not (RAW_PROFILES / "vidur" / name).is_file():
        pytest.skip(f"no raw {name} at {RAW_PROFILES / 'vidur'}")
    raw = load_op_table_at(RAW_PROFILES / "vidur" / name)
    packaged = load_op_table(name)
    for field in ("tokens", "layer_s", "gemm_s", "emb_s"):
        assert np.array_equal(getattr(raw, field), getattr(packaged, field)), field
    assert raw.gemm_weights == packaged.gemm_weights
    assert _gunzip(TABLES_DIR / f"{name}.gz") == derive_tables.derived_csv(
        RAW_PROFILES / "vidur" / name)


@needs_raw_profiles
def test_profile_results_equal_with_the_raw_files(monkeypatch):
    from engines.executors.profiles import PROFILES
    from policies.batch_shape import BatchShape
    shapes = [BatchShape.prefill_only(n, c) for n in (1, 77, 512, 3000, 40000) for c in (0, 900)]
    # the profiles whose raw files are all beside the checkout (a 70B's may not be)
    raw = {n: p for n, p in PROFILES.items()
           if all((RAW_PROFILES / "vidur" / f).is_file()
                  for f in (p.ops_file, getattr(p, "network_file", None)) if f)}
    packaged = {n: [p.step_time(s) for s in shapes] for n, p in raw.items()}
    monkeypatch.setenv(PROFILES_VAR, str(RAW_PROFILES))
    assert {n: [p.step_time(s) for s in shapes] for n, p in raw.items()} == packaged


@needs_raw_profiles
def test_reference_numbers_equal_the_shared_readme():
    assert from_readme((RAW_PROFILES / "README.md").read_text()) == load_refs()
    assert REFS_FILE.read_text() == derive_profile_refs.derived_json(RAW_PROFILES)


@pytest.mark.slow
@needs_raw_traces
@pytest.mark.parametrize("name", sorted(TRACE_FILES))
def test_traces_equal_the_raw_files(name):
    raw = RAW_TRACES / TRACE_FILES[name]
    if not raw.is_file():
        pytest.skip(f"no raw trace at {raw}")
    raw_rows = load_rows(str(raw))
    assert [(r.prompt_len, r.output_len) for r in raw_rows] == load_trace(name)
    first = raw_rows[0].arrival or 0.0
    assert [r.arrival for r in load_rows(name)] == (
        [None] * len(raw_rows) if raw_rows[0].arrival is None
        else [pytest.approx(r.arrival - first, abs=1e-6) for r in raw_rows])
    assert _gunzip(TRACE_DATA_DIR / f"{name}.csv.gz") == derive_traces.derived_csv(raw)


@pytest.mark.slow
def test_derivations_write_what_they_read(tmp_path):
    """Each derivation script, on a raw folder of its own making, reproduces its input."""
    vidur = tmp_path / "profiles" / "vidur"
    vidur.mkdir(parents=True)
    names = derive_tables.ops_files() + derive_tables.network_files()
    for name in names:
        (vidur / name).write_bytes(_gunzip(TABLES_DIR / f"{name}.gz"))
    written = derive_tables.derive(tmp_path / "profiles", tmp_path)
    assert [_gunzip(p) for p in written] == [_gunzip(TABLES_DIR / f"{n}.gz") for n in names]
    first = written[0].read_bytes()
    derive_tables.derive(tmp_path / "profiles", tmp_path)
    assert written[0].read_bytes() == first  # byte-reproducible
    traces = tmp_path / "traces"
    traces.mkdir()
    for name, filename in TRACE_FILES.items():
        (traces / filename).write_bytes(_gunzip(TRACE_DATA_DIR / f"{name}.csv.gz"))
    out = tmp_path / "trace_out"
    out.mkdir()
    for path in derive_traces.derive(traces, out):
        assert _gunzip(path) == _gunzip(TRACE_DATA_DIR / path.name)


# ---- a fresh copy with no ../shared passes ----------------------------------------------------
#: A representative subset: profiles, traces and workloads, short simulations and their CLI.
FRESH_TESTS = ("tests/test_gpu_profiles.py", "tests/test_bench_workload.py",
               "tests/test_packaged_data.py", "tests/test_simulator.py",
               "tests/test_simulator_cli.py")


def _repository_files() -> list[str]:
    """Tracked files and untracked ones git does not ignore; skips outside a git checkout."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    return [f for f in listed.stdout.split("\0") if f and (ROOT / f).is_file()]


@pytest.mark.slow
def test_a_copy_without_shared_passes_its_tests(tmp_path):
    copy = tmp_path / "repo"
    for name in _repository_files():
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / name)
    assert not (tmp_path / "shared").exists()
    env = {k: v for k, v in os.environ.items() if k not in (PROFILES_VAR, TRACES_VAR)}

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, *args], cwd=copy, env=env, capture_output=True,
                              text=True, timeout=600, check=False)
        assert done.returncode == 0, (args, done.stdout[-4000:], done.stderr[-2000:])
        return done.stdout

    where = run("-c", "import bench.loadgen.traces, engines.executors.profiles as p; "
                      "print(bench.loadgen.traces.__file__); print(p.__file__)")
    assert all(line.startswith(str(copy)) for line in where.split()), where  # the copy's code
    # one -q whatever setup.cfg's addopts say: -qq would drop the "N passed ..." summary line
    out = run("-m", "pytest", "-o", "addopts=", "-q", "-rs", "-p", "no:cacheprovider",
              "-m", "not slow", *FRESH_TESTS)
    summary = re.search(r"^=*\s*(\d+ passed.* in [\d.]+s)", out, re.MULTILINE)
    assert summary, out[-4000:]
    print(f"\na copy without ../shared ({len(FRESH_TESTS)} test files): {summary.group(1)}")
    assert "failed" not in summary.group(1) and "error" not in summary.group(1), out[-4000:]
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    # only the comparisons with the raw files skip: there are none beside the copy
    assert skipped and all("no raw" in line for line in skipped), out[-4000:]
    run("-m", "daemon.cli", "simulate", "--layout", "2L1H", "--profile", "a100-llama3-8b",
        "--trace", "arxiv", "--qps", "2", "--num-requests", "20")
    assert "ratio" in run("-m", "bench.studies.profile_check")
