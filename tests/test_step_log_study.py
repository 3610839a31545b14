"""bench/profiling/step_log_study.py: a run whose every batch took 10 % longer reads 1.10
against the first, batch composition by composition; a run's steps make a profile whose
simulation charges that run's times (whole turns with `--turn`, the run's total with
`--match-total`).

Covers: bench/profiling/step_log_study.py.
"""
from __future__ import annotations

import msgspec
import pytest

from bench.profiling.step_log_study import main, paired, run_profile, summary
from engines.executors.profiles.measured import features, load_measured
from engines.step_log import StepRecord, turns
from policies.batch_shape import BatchShape
from tests.test_measured_profile import HOST, KNOWN, fake_profile, known_host_samples


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
    assert turn.host is None and turn.overhead is None  # the base timed no host path
    path = tmp_path / "turn.json"
    path.write_bytes(msgspec.json.encode(turn))
    fitted = load_measured(path)  # its fit charges the run's whole turns, summed
    assert sum(fitted.step_time(BatchShape.of(r.prefills, r.decodes)) for r in records) == \
        pytest.approx(sum(turns(records)), rel=1e-6)


def test_a_profile_of_a_run_s_turns_keeps_the_per_request_cost_alone(tmp_path):
    """The turns hold the instance's own time a step: a file of them charges no per-step
    host cost again, but a request's own cost (read off the base's lone requests) stays."""
    base = tmp_path / "base.json"
    fake_profile(base, host=known_host_samples())
    path = tmp_path / "turn.json"
    path.write_bytes(msgspec.json.encode(run_profile(str(base), _records(), turn=True)))
    host = load_measured(path).host
    assert host.step_s == 0 and host.step_per_seq_s == 0
    # the lone request's TTFT less the turn fit's prefill, which holds part of a step's
    # own time: between the request's cost and that plus a step's
    assert HOST.request_s < host.request_s < HOST.request_s + HOST.step(1)


def test_a_step_log_that_is_not_one_is_a_clear_error(tmp_path, capsys):
    base = tmp_path / "base.json"
    fake_profile(base)
    bad = tmp_path / "steps-0.jsonl"
    bad.write_text("not a record\n")
    assert main(["compare", "--profile", str(base), str(bad)]) == 2
    assert "steps-0.jsonl" in capsys.readouterr().err
