"""Measured profiles (`ascendra profile`, engines/executors/profiles/measured.py): the file
round-trips, a profile of an executor with known step times makes the simulator charge
exactly those times, and a malformed or mismatched profile is a clear error.

Covers: daemon/profile_cmd.py, engines/executors/profiles/measured.py, engines/executors/profiles/profile_grid.py.
"""
from __future__ import annotations

import dataclasses

import msgspec
import pytest

from bench.sim.simulator import Simulation
from bench.sim.sim_instances import SimConfig
from bench.loadgen.workload import WorkloadRequest
from daemon.profile_cmd import timed_steps
from engines.calibration import stated_latency
from engines.executors.profiles.measured import (
    PROFILE_FORMAT, ProfileFile, check_model, features, load_measured, read_profile,
    write_profile,
)
from engines.executors.profiles.profile_grid import profile_grid
from engines.executors.profiles.registry import LLAMA3_8B, get_profile
from engines.executors.sim_executor import SimExecutor
from engines.perf.hardware_spec import HardwareSpec

#: The known step time: a constant, per token, per sequence and per attended token.
KNOWN = (2e-3, 4e-6, 3e-5, 1e-9, 2e-8)


def known_seconds(batch) -> float:
    return float(features(batch.shape()) @ KNOWN) if batch else 0.0


def fake_profile(path, steps=None, **fields) -> ProfileFile:
    """A profile of a sim executor whose every step takes `known_seconds`."""
    executor = SimExecutor(known_seconds, num_kv_blocks=4096, block_size=16, max_model_len=4096)
    if steps is None:
        grid = profile_grid(512, 4096, 64, 4096 * 16 - 64 * 16, quick=True)
        steps, _ = timed_steps(executor, grid, repeats=2, timer=stated_latency)
    profile = ProfileFile(
        format=PROFILE_FORMAT, device="fake", torch_version="0", driver_version="",
        model_dir="fake-model", model=LLAMA3_8B, dtype="bfloat16", tp=1,
        date="2026-11-28T00:00:00+00:00", block_size=16, num_kv_blocks=4096,
        max_model_len=4096, hardware=HardwareSpec("fake", 1e12, 1e11), repeats=2, steps=steps)
    profile = msgspec.structs.replace(profile, **fields)
    write_profile(path, profile)
    return profile


def test_a_profile_file_round_trips(tmp_path):
    path = tmp_path / "p.json"
    written = fake_profile(path)
    assert read_profile(path) == written
    assert {s.kind for s in written.steps} == {"prefill", "decode", "mixed"}
    assert all(len(s.seconds) == 2 for s in written.steps)


def test_a_simulation_on_a_profile_charges_the_profiled_step_times(tmp_path):
    path = tmp_path / "known.json"
    fake_profile(path)
    assert load_measured(path).fit_mape < 1e-9
    workload = [WorkloadRequest(index=i, arrival=0.05 * i, prompt_len=100 + 37 * i,
                                output_len=20 + i) for i in range(40)]
    simulation = Simulation(SimConfig(layout_modes=("sarathi",), profile=str(path),
                                      max_model_len=4096), workload)
    charged = []
    executor = simulation.instances[0].executor
    latency = executor.latency_fn
    executor.latency_fn = lambda batch: charged.append((known_seconds(batch), latency(batch))) \
        or charged[-1][1]
    records = simulation.run()
    assert all(r.outcome == "completed" for r in records)
    assert len(charged) > 50 and max(b for _, b in charged) > 2 * min(b for _, b in charged)
    assert [b for _, b in charged] == pytest.approx([a for a, _ in charged], rel=1e-9)
    assert simulation.instances[0].core.kv.num_blocks == 4096  # the profiled KV cache


def test_a_malformed_profile_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json.*not a profile"):
        get_profile(str(bad))
    old = tmp_path / "old.json"
    old.write_text('{"format": 99}')
    with pytest.raises(ValueError, match="format 99.*reads format 1"):
        get_profile(str(old))
    partial = tmp_path / "partial.json"
    partial.write_text(f'{{"format": {PROFILE_FORMAT}, "device": "cpu"}}')
    with pytest.raises(ValueError, match="malformed.*missing required field"):
        get_profile(str(partial))
    empty = tmp_path / "empty.json"
    fake_profile(empty, steps=[])
    with pytest.raises(ValueError, match="no timed steps"):
        get_profile(str(empty))
    with pytest.raises(ValueError, match="missing.json.*No such file"):
        get_profile(str(tmp_path / "missing.json"))


def test_a_profile_of_another_model_shape_is_refused(tmp_path):
    path = tmp_path / "p.json"
    fake_profile(path)
    other = dataclasses.replace(LLAMA3_8B, layers=16)
    with pytest.raises(ValueError, match="measured on a model of shape"):
        check_model(load_measured(path), other, "small-model")
    check_model(load_measured(path), LLAMA3_8B, "same")  # the same shape passes


def test_simulate_names_a_bad_profile_file_and_exits_2(tmp_path, capsys):
    from daemon.cli import main
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--profile", str(bad), "--num-requests", "5"])
    assert exit_.value.code == 2
    assert "bad.json" in capsys.readouterr().err


def test_a_sim_instance_refuses_a_profile_of_another_model(tmp_path, tiny_models):
    from engines.executors.build import build_executor
    from engines.executors.executor_config import ExecutorConfig
    path = tmp_path / "p.json"
    fake_profile(path)  # measured on Llama-3-8B's shape
    with pytest.raises(ValueError, match="measured on a model of shape"):
        build_executor(ExecutorConfig(kind="sim", latency=f"profile:{path}",
                                      model_dir=str(tiny_models["llama"])))
