"""Replaying a live machine's speed in the simulator (bench/sim/speed_trace.py, `simulate
--speed-trace`, `step_log_study speed-trace`): a run's speed window by window comes back
from its step log; a trace of one factor simulates exactly the profile scaled by it; a
slow window slows only the steps that start in it; a bad trace is a clear error.

Covers: bench/sim/speed_trace.py, bench/sim/simulator.py, bench/sim/simulate_cmd.py, bench/profiling/step_log_study.py.
"""
from __future__ import annotations

import msgspec
import pytest

from bench.loadgen.workload import WorkloadRequest
from bench.profiling.profile_blend import scale
from bench.profiling.step_log_study import main as study, speed_trace
from bench.sim.sim_instances import SimConfig
from bench.sim.simulator import Simulation
from bench.sim.speed_trace import SpeedTrace, read_speed_trace, write_speed_trace
from daemon.cli import main as cli
from engines.executors.profiles.measured import load_measured, read_profile
from tests.test_measured_profile import fake_profile
from tests.test_step_log_study import _records


def test_the_factor_is_the_window_s_and_the_ends_hold():
    trace = SpeedTrace(window_s=0.5, factors=[1.2, 0.9, 1.0])
    assert [trace.at(t) for t in (-1.0, 0.0, 0.49, 0.5, 1.2, 99.0)] == \
        [1.2, 1.2, 1.2, 0.9, 1.0, 1.0]


def _run(profile_path, trace: SpeedTrace | None, workload):
    config = SimConfig(layout_modes=("sarathi",), profile=str(profile_path),
                       max_model_len=4096, speed_trace=trace)
    return {r.index: r for r in Simulation(config, workload).run()}


def _workload(n: int = 30, gap: float = 0.05):
    return [WorkloadRequest(index=i, arrival=gap * i, prompt_len=120 + 13 * i, output_len=16)
            for i in range(n)]


def test_a_trace_of_one_factor_simulates_the_profile_scaled_by_it(tmp_path):
    base = tmp_path / "p.json"
    fake_profile(base)
    slow = tmp_path / "slow.json"
    slow.write_bytes(msgspec.json.encode(scale(read_profile(base), 1.5)))
    work = _workload()
    replayed = _run(base, SpeedTrace(window_s=1.0, factors=[1.5]), work)
    scaled = _run(slow, None, work)
    for i, record in scaled.items():
        assert replayed[i].ttft() == pytest.approx(record.ttft(), rel=1e-9)
        assert replayed[i].mean_tbt() == pytest.approx(record.mean_tbt(), rel=1e-9)


def test_a_slow_window_slows_only_the_steps_that_start_in_it(tmp_path):
    base = tmp_path / "p.json"
    fake_profile(base)
    work = _workload(n=8, gap=2.0)  # one request at a time, each alone on the box
    plain = _run(base, None, work)
    slow_first = _run(base, SpeedTrace(window_s=2.0, factors=[3.0, 1.0]), work)
    assert slow_first[0].ttft() > 2 * plain[0].ttft()
    assert slow_first[0].mean_tbt() == pytest.approx(3 * plain[0].mean_tbt(), rel=1e-9)
    for i in range(2, 8):  # after the first window: as the profile says
        assert slow_first[i].ttft() == pytest.approx(plain[i].ttft(), rel=1e-9)


def test_a_run_s_speed_comes_back_window_by_window(tmp_path):
    fake_profile(tmp_path / "p.json")
    profile = load_measured(tmp_path / "p.json")
    fast, slow = _records(0.9), _records(1.3)
    shift = fast[-1].start + 1.0 - slow[0].start  # the slow half after an idle second
    slow = [msgspec.structs.replace(r, start=r.start + shift) for r in slow]
    window = 0.2
    trace = speed_trace(fast + slow, profile, window)
    first_slow = int((slow[0].start - fast[0].start) // window)
    assert trace.factors[0] == pytest.approx(0.9, rel=1e-6)
    assert trace.factors[first_slow] == pytest.approx(1.3, rel=1e-6)
    idle = int((fast[-1].start - fast[0].start) // window) + 2
    assert trace.factors[idle] == pytest.approx(0.9, rel=1e-6)  # idle: keeps the one before


def test_the_study_writes_a_trace_that_simulate_replays(tmp_path, capsys):
    fake_profile(tmp_path / "p.json")
    log = tmp_path / "steps-0.jsonl"
    log.write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in _records(1.2)))
    trace = tmp_path / "t.json"
    assert study(["speed-trace", "--profile", str(tmp_path / "p.json"), "--window", "0.5",
                  "--out", str(trace), str(log)]) == 0
    assert read_speed_trace(trace).factors[0] == pytest.approx(1.2, rel=1e-6)
    flags = ["simulate", "--profile", str(tmp_path / "p.json"), "--layout", "1xsarathi",
             "--qps", "2", "--num-requests", "10", "--max-model-len", "4096",
             "--json", str(tmp_path / "r.json")]
    assert cli([*flags, "--speed-trace", str(trace)]) == 0
    assert cli([*flags, "--speed-trace", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_a_bad_speed_trace_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    write_speed_trace(bad, SpeedTrace(window_s=0.5, factors=[1.0, 0.0]))
    with pytest.raises(ValueError, match="bad.json.*each > 0"):
        read_speed_trace(bad)
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(ValueError, match="junk.json.*malformed"):
        read_speed_trace(tmp_path / "junk.json")
