"""Profiles on a machine whose speed wanders (bench/profiling/profile_blend.py, `ascendra
profile --join`, and the grid timed in passes): a step's repetitions span the whole
profiling; two timings of one grid join into one file whose steps hold both; a file
scaled by a factor charges that factor more for every step, the daemon's path as timed; a run's speed
against a profile reads its factor back; files of another grid or executor are refused
by name.

Covers: bench/profiling/profile_blend.py, bench/profiling/profile_cmd.py, bench/profiling/step_log_study.py.
"""
from __future__ import annotations

import itertools

import msgspec
import pytest

from bench.profiling.profile_blend import join, scale
from bench.profiling.profile_cmd import timed_steps
from bench.profiling.step_log_study import speed
from daemon.cli import main as cli
from engines.executors.profiles.measured import features, load_measured, read_profile
from engines.executors.profiles.profile_grid import profile_grid
from engines.executors.sim_executor import SimExecutor
from policies.batch_shape import BatchShape
from tests.test_measured_profile import (
    KNOWN, fake_profile, known_host_samples, known_overhead, known_seconds,
)
from tests.test_step_log_study import _records


def test_a_machine_slowing_while_profiled_slows_every_step_alike():
    """Each pass times the whole grid once: with a machine 1 % slower at every call, a
    step's repetitions lie a pass apart and every step's median is the middle pass's."""
    executor = SimExecutor(known_seconds, num_kv_blocks=4096, block_size=16, max_model_len=4096)
    grid = profile_grid(512, 4096, 64, 4096 * 16 - 64 * 16, quick=True)
    calls = itertools.count()
    slowing = lambda _executor, batch: 1.0 + 0.01 * next(calls)  # noqa: E731
    steps, _ = timed_steps(executor, grid, repeats=3, timer=slowing)
    per_pass = len(steps) + 1  # each pass warms up once, untimed
    for step in steps:
        first, second, third = step.seconds
        assert second - first == pytest.approx(0.01 * per_pass)
        assert third - second == pytest.approx(0.01 * per_pass)
    medians = [step.median for step in steps]
    assert max(medians) / min(medians) < 1 + 0.01 * per_pass


def test_two_timings_of_one_grid_join_into_one_file_with_both(tmp_path):
    one = fake_profile(tmp_path / "one.json", host=known_host_samples(),
                       overhead=known_overhead())
    slower = scale(one, 1.2)
    joined = join([("one", one), ("slower", slower)])
    assert joined.repeats == one.repeats + slower.repeats
    for step, a, b in zip(joined.steps, one.steps, slower.steps):
        assert step.seconds == a.seconds + b.seconds
    assert joined.host == one.host + slower.host
    assert joined.overhead == one.overhead + slower.overhead
    assert join([("one", one), ("bare", msgspec.structs.replace(one, host=None))]).host is None


def test_a_scaled_profile_charges_its_factor_on_every_step_and_keeps_the_host_path(tmp_path):
    fake_profile(tmp_path / "one.json", host=known_host_samples(), overhead=known_overhead())
    base = read_profile(tmp_path / "one.json")
    (tmp_path / "slow.json").write_bytes(msgspec.json.encode(scale(base, 1.25)))
    one, slow = load_measured(tmp_path / "one.json"), load_measured(tmp_path / "slow.json")
    for shape in (BatchShape.of([(300, 0)], []), BatchShape.of([], [200] * 16),
                  BatchShape.of([(64, 128)], [500] * 4)):
        assert slow.step_time(shape) == pytest.approx(1.25 * one.step_time(shape), rel=1e-6)
    # the daemon's own time a step is as timed; a request's cost is read off the lone
    # requests' TTFT less the (now slower) fitted prefill
    assert (slow.host.step_s, slow.host.step_per_seq_s) == (one.host.step_s,
                                                             one.host.step_per_seq_s)
    prefill = one.step_time(BatchShape.prefill_only(known_host_samples()[0].prompt_len))
    assert slow.host.request_s == pytest.approx(one.host.request_s - 0.25 * prefill, rel=1e-6)
    with pytest.raises(ValueError, match="factor"):
        scale(base, 0.0)


def test_a_run_s_speed_against_a_profile_is_the_factor_its_steps_took(tmp_path):
    fake_profile(tmp_path / "p.json")
    profile = load_measured(tmp_path / "p.json")
    assert speed(_records(1.3), profile) == pytest.approx(1.3, rel=1e-6)
    shape = BatchShape.of([], [150] * 8)
    assert profile.step_time(shape) == pytest.approx(float(features(shape) @ KNOWN))


def test_files_of_another_grid_or_executor_are_refused_by_name(tmp_path):
    one = fake_profile(tmp_path / "one.json")
    other_cache = msgspec.structs.replace(one, num_kv_blocks=1024)
    with pytest.raises(ValueError, match="'small' has another num_kv_blocks"):
        join([("one", one), ("small", other_cache)])
    other_grid = msgspec.structs.replace(one, steps=one.steps[:-1])
    with pytest.raises(ValueError, match="'short' timed another grid"):
        join([("one", one), ("short", other_grid)])


def test_profile_join_writes_one_file_and_names_a_mismatch(tmp_path, capsys):
    one = fake_profile(tmp_path / "one.json")
    (tmp_path / "slow.json").write_bytes(msgspec.json.encode(scale(one, 1.1)))
    out = tmp_path / "day.json"
    assert cli(["profile", "--join", str(tmp_path / "one.json"), str(tmp_path / "slow.json"),
                "--out", str(out)]) == 0
    assert read_profile(out).repeats == 2 * one.repeats
    assert "from 2 files" in capsys.readouterr().out
    (tmp_path / "odd.json").write_bytes(msgspec.json.encode(
        msgspec.structs.replace(one, tp=2)))
    assert cli(["profile", "--join", str(tmp_path / "one.json"), str(tmp_path / "odd.json"),
                "--out", str(tmp_path / "bad.json")]) == 2
    assert "another tp" in capsys.readouterr().err
