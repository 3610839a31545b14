"""Measured profiles (`ascendra profile`, engines/executors/profiles/measured.py): the file
round-trips, a profile of an executor with known step times makes the simulator charge
exactly those times, known host costs (the daemon's path timed live) come back from their
samples and the simulator charges them, and a malformed or mismatched profile is a clear
error.

Covers: bench/profiling/profile_cmd.py, bench/profiling/host_timing.py, bench/sim/host_charges.py, engines/executors/profiles/measured.py, engines/executors/profiles/profile_grid.py.
"""
from __future__ import annotations

import dataclasses

import msgspec
import pytest

from bench.sim.simulator import Simulation
from bench.sim.sim_instances import SimConfig
from bench.loadgen.workload import WorkloadRequest
from bench.profiling.profile_cmd import timed_steps
from engines.calibration import stated_latency
from engines.executors.profiles.measured import (
    PROFILE_FORMAT, HostCosts, HostSample, ProfileFile, StepOverhead, check_model, features,
    load_measured, padding, read_profile, write_profile,
)
from engines.step_log import StepRecord
from policies.batch_shape import BatchShape
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
    assert {s.kind for s in written.steps} == {"prefill", "decode", "spread", "mixed"}
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


#: What a decode costs per position short of its batch's longest (a padding backend).
PAD = 5e-8


def padded_seconds(batch) -> float:
    return known_seconds(batch) + PAD * padding(batch.shape()) if batch else 0.0


def test_spread_steps_teach_the_profile_what_decodes_of_differing_contexts_cost(tmp_path):
    """An executor that pays for decode padding: the grid's spread steps show it, the fit
    (format 3) prices it, and a traffic-like batch is charged what the executor takes."""
    executor = SimExecutor(padded_seconds, num_kv_blocks=4096, block_size=16,
                           max_model_len=4096)
    grid = profile_grid(512, 4096, 64, 4096 * 16 - 64 * 16, quick=True)
    assert any(kind == "spread" and len(set(shape.decodes)) > 1 for kind, shape in grid)
    steps, _ = timed_steps(executor, grid, repeats=2, timer=stated_latency)
    path = tmp_path / "padded.json"
    fake_profile(path, steps=steps)
    profile = load_measured(path)
    assert profile.pads and profile.fit_mape < 1e-9
    traffic = BatchShape.of(prefills=[(100, 0)], decodes=[900, 400, 37, 12])
    assert profile.step_time(traffic) == pytest.approx(
        float(features(traffic) @ KNOWN) + PAD * padding(traffic), rel=1e-9)
    uniform = BatchShape.of(decodes=[300] * 8)
    assert padding(uniform) == 0
    assert profile.step_time(uniform) == pytest.approx(float(features(uniform) @ KNOWN))


def test_a_file_without_spread_steps_fits_the_five_costs_as_before(tmp_path):
    """A format 1 or 2 file (no spread steps) is priced as it always was: no sixth cost,
    so its simulations are unchanged."""
    whole = fake_profile(tmp_path / "whole.json")
    older = tmp_path / "older.json"
    fake_profile(older, format=2, steps=[s for s in whole.steps if s.kind != "spread"])
    profile = load_measured(older)
    assert not profile.pads and len(profile.coefficients) == len(KNOWN)
    traffic = BatchShape.of(decodes=[900, 400, 37, 12])
    assert profile.step_time(traffic) == float(features(traffic) @ profile.coefficients)


def test_a_malformed_profile_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json.*not a profile"):
        get_profile(str(bad))
    old = tmp_path / "old.json"
    old.write_text('{"format": 99}')
    with pytest.raises(ValueError, match=r"format 99.*reads formats \(1, 2, 3, 4\)"):
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


#: The host costs the fake daemon's path adds: per request, per step, per sequence.
HOST = HostCosts(request_s=4e-3, step_s=1e-3, step_per_seq_s=5e-5)


def known_host_samples(prompt_len=16, output_len=32) -> list[HostSample]:
    """What a client of a daemon with `HOST` costs on the `KNOWN` executor would see."""
    def seconds(shape):
        return float(features(shape) @ KNOWN)
    samples = []
    for batch in (1, 2, 4, 8):
        decodes = [seconds(BatchShape.of(decodes=[c] * batch))
                   for c in range(prompt_len + 1, prompt_len + output_len)]
        tbt = sum(decodes) / len(decodes) + HOST.step(batch)
        ttft = seconds(BatchShape.prefill_only(prompt_len)) + HOST.step(1) + HOST.request_s
        samples.append(HostSample(batch, prompt_len, output_len, [ttft] * batch, [tbt] * batch))
    return samples


def test_host_costs_come_back_from_their_samples_and_round_trip(tmp_path):
    path = tmp_path / "host.json"
    written = fake_profile(path, host=known_host_samples())
    assert read_profile(path) == written
    host = load_measured(path).host
    assert (host.request_s, host.step_s, host.step_per_seq_s) == pytest.approx(
        (HOST.request_s, HOST.step_s, HOST.step_per_seq_s), rel=1e-6)


def known_overhead() -> list[StepOverhead]:
    """The instance's own time a step, as a step log of a daemon with `HOST` costs reads."""
    return [StepOverhead(n, HOST.step(n), 40) for n in (1, 2, 4, 8)]


def test_a_step_log_s_overhead_sets_the_step_costs_beside_the_fit_s_error(tmp_path):
    """The clients' TBTs say a step costs 2 ms more than the fit, the instance's own log
    says `HOST`'s: the file with both charges what the instance spent, and the request's
    cost is still read off the lone requests."""
    samples = [msgspec.structs.replace(s, tbt_s=[t + 2e-3 for t in s.tbt_s])
               for s in known_host_samples()]
    path = tmp_path / "logged.json"
    written = fake_profile(path, host=samples, overhead=known_overhead())
    assert read_profile(path) == written
    host = load_measured(path).host
    assert (host.request_s, host.step_s, host.step_per_seq_s) == pytest.approx(
        (HOST.request_s, HOST.step_s, HOST.step_per_seq_s), rel=1e-6)
    fake_profile(tmp_path / "unlogged.json", host=samples)
    assert load_measured(tmp_path / "unlogged.json").host.step_s == pytest.approx(
        HOST.step_s + 2e-3, rel=1e-6)


def test_the_host_phase_s_overhead_is_each_turn_less_the_executor_by_step_size():
    from bench.profiling.host_timing import step_overheads
    records, now = [], 0.0
    for i in range(30):
        seqs = 1 + i % 3
        records.append(StepRecord(start=now, core_s=1e-4, execute_s=2e-3, cpu_s=2e-3,
                                  finish_s=1e-4 * seqs, prefills=[], decodes=[40] * seqs))
        now += 2e-3 + 1e-4 + 1e-4 * seqs + (5e-3 if i % 10 == 9 else 1e-4)  # idle: a gap
    overhead = {e.num_seqs: e for e in step_overheads(records)}
    assert sorted(overhead) == [1, 2, 3] and sum(e.steps for e in overhead.values()) == 30
    for seqs, entry in overhead.items():  # core, finish, and the 0.1 ms to the next step
        assert entry.seconds == pytest.approx(1e-4 + 1e-4 * seqs + 1e-4)


def test_a_format_1_file_reads_as_one_without_host_costs(tmp_path):
    path = tmp_path / "old.json"
    fake_profile(path, format=1)
    assert load_measured(path).host is None


def test_the_simulator_charges_the_host_costs_of_a_lone_request(tmp_path):
    """A request alone: its TTFT is its prefill step, that step's host cost and the
    request's; each further token a decode step and its host cost -- the live sample."""
    with_host, without = tmp_path / "host.json", tmp_path / "bare.json"
    fake_profile(with_host, host=known_host_samples())
    fake_profile(without)
    work = [WorkloadRequest(index=0, arrival=0.0, prompt_len=16, output_len=32)]
    runs = {}
    for path in (with_host, without):
        config = SimConfig(layout_modes=("sarathi",), profile=str(path), max_model_len=4096)
        runs[path] = Simulation(config, work).run()[0]
    ttft, tbt = known_host_samples()[0].ttft_s[0], known_host_samples()[0].tbt_s[0]
    assert runs[with_host].ttft() == pytest.approx(ttft, rel=1e-6)
    assert runs[with_host].mean_tbt() == pytest.approx(tbt, rel=1e-6)
    bare = runs[without]  # no host costs: only the simulator's two ipc hops beside the steps
    assert bare.ttft() == pytest.approx(ttft - HOST.request_s - HOST.step(1) + 2 * 0.0005)
    assert bare.mean_tbt() == pytest.approx(tbt - HOST.step(1), rel=1e-6)


def test_a_built_in_profile_has_no_host_costs():
    from bench.sim.host_charges import arrival_delay, host_costs
    assert host_costs(get_profile("a100-llama3-8b")) is None
    assert arrival_delay(None, 0.0005) == 0.0


def test_malformed_host_samples_are_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    fake_profile(bad, host=[HostSample(2, 16, 32, [0.01], [0.002, 0.002])])
    with pytest.raises(ValueError, match=r"bad.json.*host\[0\]"):
        get_profile(str(bad))
    alone = tmp_path / "alone.json"
    fake_profile(alone, host=known_host_samples()[1:])
    with pytest.raises(ValueError, match="no sample of batch 1"):
        get_profile(str(alone))
    negative = tmp_path / "negative.json"
    fake_profile(negative, host=known_host_samples(), overhead=[StepOverhead(1, -1e-3, 5)])
    with pytest.raises(ValueError, match=r"negative.json.*overhead\[0\]"):
        get_profile(str(negative))
    orphan = tmp_path / "orphan.json"
    fake_profile(orphan, overhead=known_overhead())
    with pytest.raises(ValueError, match="overhead without host samples"):
        get_profile(str(orphan))


@pytest.mark.slow
def test_profile_times_the_tiny_model_and_its_daemon(tmp_path, capsys):
    """The real thing, small: the tiny model's executor on CPU over a quick grid, then a
    daemon on it timed through HTTP; the file holds both and reads back with host costs."""
    from daemon.cli import main
    out = tmp_path / "tiny.json"
    code = main(["profile", "--device", "cpu", "--quick", "--repeats", "1",
                 "--chunk-size", "128", "--max-num-seqs", "4", "--max-model-len", "256",
                 "--num-kv-blocks", "256", "--out", str(out)])
    assert code == 0
    profile = load_measured(out)
    assert [s.batch for s in profile.data.host] == [1] * 10 + [2, 4]  # LONE_REPEATS
    assert "spread" in {s.kind for s in profile.data.steps}
    assert all(s.output_len == 32 and len(s.tbt_s) == s.batch for s in profile.data.host)
    assert profile.host is not None and profile.host.request_s >= 0
    assert {e.num_seqs for e in profile.data.overhead} >= {1, 2, 4}  # the daemon's step log
    assert "host costs" in capsys.readouterr().out


def test_a_torch_instance_s_performance_model_starts_from_a_profile_without_timing(tmp_path):
    """`perf_profile`: the model is the profile's (as a simulated instance's is) and the
    executor runs no batch for it; a profile of another shape is refused."""
    from engines.executors.executor_config import ExecutorConfig
    from engines.executors.torch_executor import TorchExecutor
    from engines.models.builtin import builtin_tiny_model_dir
    from engines.perf.model_shape import ModelShape
    from engines.perf_setup import build_perf_model, profile_perf_model
    from engines.scheduler_config import SchedulerConfig
    executor = TorchExecutor(builtin_tiny_model_dir(), device="cpu", num_kv_blocks=256,
                             max_model_len=512)
    tiny = ModelShape.from_config(executor.config, bytes_per_element=executor.dtype.itemsize)
    path = tmp_path / "tiny.json"
    fake_profile(path, model=tiny)
    ran = []
    executor.execute = lambda batch: ran.append(batch)
    scheduler = SchedulerConfig(mode="lp", chunk_size=256, max_num_seqs=16)
    perf = build_perf_model(executor, ExecutorConfig(kind="torch", perf_profile=str(path)),
                            scheduler)
    assert ran == []
    expected = profile_perf_model(load_measured(path), scheduler, 512, 256 * 16)
    for shape in (BatchShape.prefill_only(200, 100), BatchShape.of(decodes=[300] * 8)):
        assert perf.predict(shape) == pytest.approx(expected.predict(shape), rel=1e-12)
    other = tmp_path / "other.json"
    fake_profile(other)  # Llama-3-8B's shape
    with pytest.raises(ValueError, match="measured on a model of shape"):
        build_perf_model(executor, ExecutorConfig(kind="torch", perf_profile=str(other)),
                         scheduler)


def test_perf_profile_is_refused_on_the_sim_executor():
    from daemon.config import InstancesConfig
    with pytest.raises(ValueError, match="perf_profile: only the torch executor"):
        InstancesConfig(executor="sim", perf_profile="tiny.json")


def test_compare_sets_each_measured_step_beside_its_fit_and_the_other_profile(tmp_path, capsys):
    """`ascendra profile --compare FILE OTHER`: a step per line, its measured median, the
    fit's prediction and OTHER's, and OTHER over measured."""
    from daemon.cli import main
    path, slower = tmp_path / "p.json", tmp_path / "slower.json"
    written = fake_profile(path)
    fake_profile(slower, steps=[msgspec.structs.replace(s, seconds=[2 * x for x in s.seconds])
                                for s in written.steps])
    assert main(["profile", "--compare", str(path), str(slower)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "fit off by 0.0% on average" in lines[0] and "other/meas" in lines[1]
    rows = lines[2:]
    assert len(rows) == len(written.steps)
    for row, step in zip(rows, written.steps):
        measured, _, fit, other, ratio = row.split()[-5:]
        assert float(measured) == pytest.approx(step.median * 1e3, abs=0.006)
        assert float(fit) == pytest.approx(float(measured), abs=0.011)
        assert float(ratio) == pytest.approx(2.0, abs=0.011)
    assert main(["profile", "--compare", str(path), "a", "b"]) == 2  # FILE and one OTHER


@pytest.mark.slow
def test_profile_at_tp_2_writes_a_file_of_that_degree(tmp_path):
    """`--tp 2`: rank 0 drives a second rank process over gloo on CPU, as an instance does;
    the file says its degree, and its steps are the two ranks' together."""
    from daemon.cli import main
    out = tmp_path / "tp2.json"
    assert main(["profile", "--device", "cpu", "--tp", "2", "--quick", "--repeats", "1",
                 "--no-host", "--chunk-size", "64", "--max-num-seqs", "4", "--max-model-len",
                 "128", "--num-kv-blocks", "64", "--out", str(out)]) == 0
    profile = load_measured(out)
    assert profile.data.tp == 2 and profile.data.host is None
    assert len(profile.data.steps) > 5 and all(s.median > 0 for s in profile.data.steps)
