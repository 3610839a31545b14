"""bench/profiling/step_log_study.py: a run whose every batch took 10 % longer reads 1.10
against the first, batch composition by composition; a run's steps make a profile whose
simulation charges that run's times (whole turns with `--turn`, the run's total with
`--match-total`).

Covers: bench/profiling/step_log_study.py.
"""
from __future__ import annotations

import msgspec
import pytest

from bench.profiling.step_log_study import main, paired, run_profile, summary, turns
from engines.executors.profiles.measured import features, load_measured
from engines.step_log import StepRecord
from policies.batch_shape import BatchShape
from tests.test_measured_profile import KNOWN, fake_profile


def _records(scale: float = 1.0, gap: float = 2e-4) -> list[StepRecord]:
    """Steps of decode batches of 1-24 sequences, each taking `scale` x the known time,
    `gap` between one step's end and the next one's start."""
    records, now = [], 0.0
    for i in range(240):
        decodes = [100 + 7 * k + i % 5 for k in range(1 + i % 24)]
        prefills = [(32, 0)] if i % 10 == 0 else []
        seconds = scale * float(features(BatchShape.of(prefills, decodes)) @ KNOWN)
        records.append(StepRecord(start=now, core_s=1e-4, execute_s=seconds, cpu_s=seconds,
                                  finish_s=1e-4, prefills=prefills, decodes=decodes))
        now += 2e-4 + seconds + gap
    return records


def test_the_same_batches_taking_longer_read_as_the_machine(tmp_path):
    first, slower = _records(), _records(1.1)
    pair = paired(first, slower, min_steps=2)
    assert pair["compositions"] > 10 and pair["weighted_ratio"] == pytest.approx(1.1, abs=1e-3)
    path = tmp_path / "p.json"
    fake_profile(path)
    profile = load_measured(path)
    assert summary(first, profile)["execute_over_fit"] == pytest.approx(1.0, abs=1e-6)
    assert summary(slower, profile)["execute_over_fit"] == pytest.approx(1.1, abs=1e-6)


def test_a_run_s_turns_run_to_the_next_step_unless_the_instance_waited():
    records = _records(gap=2e-4)
    assert turns(records)[0] == pytest.approx(records[1].start - records[0].start)
    idle = _records(gap=5e-3)  # the instance waited: the turn ends with the step
    assert turns(idle)[0] == pytest.approx(1e-4 + idle[0].execute_s + 1e-4)


def test_a_profile_of_a_run_s_steps_charges_that_run_s_times(tmp_path):
    base = tmp_path / "base.json"
    fake_profile(base)
    records = _records(1.3)
    own = run_profile(str(base), records)
    assert len(own.steps) == len(records) and own.host == fake_profile(tmp_path / "x.json").host
    path = tmp_path / "own.json"
    path.write_bytes(msgspec.json.encode(own))
    fitted = load_measured(path)
    shape = BatchShape.of([], [150] * 8)
    assert fitted.step_time(shape) == pytest.approx(1.3 * float(features(shape) @ KNOWN),
                                                    rel=1e-6)
    turn = run_profile(str(base), records, match_total=True, turn=True)
    assert turn.host is None  # the turns hold the daemon's own time: no host costs again
    path = tmp_path / "turn.json"
    path.write_bytes(msgspec.json.encode(turn))
    fitted = load_measured(path)  # its fit charges the run's whole turns, summed
    assert sum(fitted.step_time(BatchShape.of(r.prefills, r.decodes)) for r in records) == \
        pytest.approx(sum(turns(records)), rel=1e-6)


def test_a_step_log_that_is_not_one_is_a_clear_error(tmp_path, capsys):
    base = tmp_path / "base.json"
    fake_profile(base)
    bad = tmp_path / "steps-0.jsonl"
    bad.write_text("not a record\n")
    assert main(["compare", "--profile", str(base), str(bad)]) == 2
    assert "steps-0.jsonl" in capsys.readouterr().err
