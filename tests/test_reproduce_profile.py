"""`ascendra reproduce results --profile FILE|NAME`: docs/results.md's tables on another
profile -- every row and study runs on it at its own SLOs, every fixed rate is scaled by
the profile's ceiling over a100-llama3-8b's (a profile twice as slow: half the rates),
and every table's stamp names the profile; a malformed profile is a clear error.

Covers: bench/studies/results_profile.py, bench/studies/results_run.py, bench/studies/results_studies.py, bench/studies/results_tables.py, bench/studies/reproduce_cmd.py, bench/studies/overload.py, bench/studies/tenants.py, bench/studies/live_check.py.
"""
from __future__ import annotations

import json
import shlex

import msgspec
import pytest

import bench.studies.results_run as results_run
from bench.ruler.ruler import SeedCapacity
from bench.studies.results_profile import profile_target
from bench.studies.results_run import ProfiledTableResult, row_command
from bench.studies.results_tables import STUDIES, TABLES
from daemon.cli import main
from tests.test_measured_profile import fake_profile
from tests.test_results_page import parse_error


@pytest.fixture
def small_profile(tmp_path):
    path = tmp_path / "small.json"
    fake_profile(path, max_model_len=2048)
    return path


def test_a_profile_twice_as_slow_gets_half_the_rates(tmp_path, small_profile):
    data = json.loads(small_profile.read_text())
    for step in data["steps"]:
        step["seconds"] = [2 * s for s in step["seconds"]]
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(data))
    fast, slower = profile_target(str(small_profile)), profile_target(str(slow))
    assert slower.rate_scale == pytest.approx(fast.rate_scale / 2, rel=2e-3)
    assert fast.max_model_len == 2048  # the file's context limit, below the tables' 8,192
    assert (fast.slo_scale.ttft, fast.slo_scale.tbt) == (1.0, 1.0)  # a measured file's SLOs


def test_reproduce_results_on_a_profile_runs_every_row_on_it_and_stamps_the_table(
        tmp_path, small_profile, monkeypatch, capsys):
    searched = []

    def fake_search(job):
        searched.append(job[0])
        return SeedCapacity(job[1], 5.0, [], True, 4.0)

    monkeypatch.setattr(results_run, "search", fake_search)
    monkeypatch.setattr(results_run, "_commit", lambda: "abc1234")
    out = tmp_path / "out"
    assert main(["reproduce", "results", "--table", "replay", "--profile", str(small_profile),
                 "--workers", "1", "--out", str(out)]) == 0
    target = profile_target(str(small_profile))
    row = TABLES["replay"].groups[0].rows[0]
    assert row_command(row, TABLES["replay"].protocol, target=target) in searched
    assert searched and all(f"--profile {small_profile} --max-model-len 2048" in c
                            for c in searched)
    # the searches start near the A100 capacity times the rate scale
    starts = [float(shlex.split(c)[shlex.split(c).index("--start-qps") + 1]) for c in searched]
    assert starts[0] == pytest.approx(row.start * target.rate_scale, abs=1e-3)
    text = (out / "replay.md").read_text()
    assert f"**On profile `{small_profile}`**" in text
    assert f"fixed rates x{target.rate_scale:g}" in text and "2,048 tokens" in text
    assert f"`ascendra reproduce results --table replay --profile {small_profile} --out DIR`" \
        in text
    doc = msgspec.json.decode((out / "replay.json").read_bytes(), type=ProfiledTableResult)
    assert doc.target == target


def test_each_study_runs_on_the_profile_at_scaled_rates(small_profile, monkeypatch):
    target = profile_target(str(small_profile))
    overload = STUDIES["overload"].command(False, "/tmp/x", target)
    assert f"--capacity {target.rate(9.47):g} " in overload
    tenants = STUDIES["tenants"].command(True, "/tmp/x", target)
    assert f"--capacity {target.rate(11.3):g} " in tenants  # its default, scaled
    live = STUDIES["live"].command(False, "/tmp/x", target)
    assert f"--points poisson:{target.rate(10.4):g},bursty-cv4:{target.rate(4.7):g}," in live
    for name, study in STUDIES.items():
        for quick in (False, True):
            command = study.command(quick, "/tmp/x", target)
            assert f"--profile {small_profile} --max-model-len 2048" in command, name
            assert parse_error(command, monkeypatch) is None, command


def test_without_a_profile_nothing_changes():
    for study in STUDIES.values():
        assert "--profile" not in study.command(False) + study.command(True)
    for table in TABLES.values():
        for group in table.groups:
            assert all("--profile" not in row_command(r, table.protocol) for r in group.rows)


def test_a_malformed_profile_is_a_clear_error_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    out = tmp_path / "out"
    assert main(["reproduce", "results", "--quick", "--profile", str(bad),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--profile" in err and "bad.json" in err and "not a profile" in err
    assert not out.exists()
    assert main(["reproduce", "fig9", "--profile", str(bad), "--out", str(out)]) == 2
    assert "only `reproduce results`" in capsys.readouterr().err
