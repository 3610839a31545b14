"""`serve --step-log DIR` (instances.step_log): each instance process records every step
it runs -- the batch and the executor's time -- for comparing a live run's steps at equal
batch composition; off, nothing is written.

Covers: engines/step_log.py, engines/instance.py, engines/instance_config.py, daemon/serve_cmd.py, bench/studies/measured_loop.py.
"""
from __future__ import annotations

import argparse
import itertools

import pytest

from daemon.config import add_config_flags, config_from_args
from daemon.serve_cmd import instance_configs
from engines.scheduler_config import SchedulerConfig
from engines.step_log import StepLog, read_step_log
from ipc.messages import Role, StepOutputs
from tests.fakes import FakeExecutor, FakeInstance
from tests.test_instance_core import submit


def _configs(tmp_path, *flags: str):
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    config = config_from_args(parser.parse_args(["--layout", "2xsarathi", *flags]))
    (plan,) = config.model_plans()
    return instance_configs(config, plan, "ipc:///tmp/x.sock", tmp_path)


def test_the_flag_gives_each_instance_its_own_file_and_unset_none(tmp_path):
    logged = _configs(tmp_path, "--step-log", str(tmp_path / "steps"))
    assert [c.step_log for c in logged] == [str(tmp_path / "steps" / f"steps-{i}.jsonl")
                                            for i in (0, 1)]
    assert [c.step_log for c in _configs(tmp_path)] == ["", ""]


def test_every_step_is_recorded_with_its_batch_and_times(tmp_path):
    driver = FakeInstance(0, Role.PEER, SchedulerConfig(mode="sarathi", chunk_size=8),
                          FakeExecutor(num_kv_blocks=64))
    driver.core.take([submit("a", prompt=range(1, 13), max_tokens=3),
                      submit("b", prompt=(5, 6), max_tokens=2)], now=0.0)
    ticks = itertools.count()
    clock = lambda: 0.5 * next(ticks)  # noqa: E731 -- each reading half a second on
    log = StepLog(tmp_path / "steps.jsonl")
    steps = 0
    while driver.core.has_work:
        outputs = log.timed_step(driver.core, driver.executor, clock)
        steps += any(isinstance(m, StepOutputs) for m in outputs)
    log.close()
    records = read_step_log(tmp_path / "steps.jsonl")
    assert len(records) == steps == 4
    # a's first 8 prompt tokens (the chunk size); its last 4 beside b's 2; then decodes
    # at their contexts (the new token included)
    assert [(r.prefills, r.decodes) for r in records] == [
        ([(8, 0)], []), ([(4, 8), (2, 0)], []), ([], [13, 3]), ([], [14])]
    # each reading is 0.5 s after the last: begin_step, execute and finish_step each one
    assert all((r.core_s, r.execute_s, r.finish_s) == (0.5, 0.5, 0.5) for r in records)
    assert all(r.cpu_s >= 0 for r in records)


def test_a_line_that_is_not_a_record_is_an_error_naming_the_file(tmp_path):
    bad = tmp_path / "steps-0.jsonl"
    bad.write_text('{"start": 0}\n')
    with pytest.raises(ValueError, match="steps-0.jsonl.*line 1"):
        read_step_log(bad)


def test_a_multiplexed_instance_s_step_is_recorded_with_every_model_s_batch(tmp_path):
    from tests.test_mux_core import _core, _submit
    core, executor = _core()
    core.take([_submit("a", "big", prompt_len=10, max_tokens=3),
               _submit("b", "small", prompt_len=6, max_tokens=2)], now=0.0)
    ticks = itertools.count()
    log = StepLog(tmp_path / "steps.jsonl")
    while core.has_work:
        log.timed_step(core, executor, lambda: 0.1 * next(ticks))
    log.close()
    records = read_step_log(tmp_path / "steps.jsonl")
    assert records[0].prefills == [(10, 0), (6, 0)]  # both models' prompts in one step
    assert sum(len(r.decodes) for r in records) == (3 - 1) + (2 - 1)


@pytest.mark.slow
def test_a_served_request_s_steps_are_in_the_instance_s_step_log(tmp_path, daemon_factory):
    """The real thing: `serve --step-log DIR`, one completion; the instance's file holds
    its prefill and its decodes once the daemon has stopped."""
    from tests.daemon_fixture import sim_args
    folder = tmp_path / "steps"
    daemon = daemon_factory(*sim_args("constant:0.002"), "--step-log", str(folder))
    status, body = daemon.post_json("/v1/completions", {
        "model": body_model(daemon), "prompt": "hello there", "max_tokens": 5,
        "ignore_eos": True})
    assert status == 200 and body["usage"]["completion_tokens"] == 5
    daemon.close()
    records = read_step_log(folder / "steps-0.jsonl")
    prompt = body["usage"]["prompt_tokens"]
    assert sum(c for r in records for c, _ in r.prefills) == prompt
    assert [r.decodes for r in records if r.decodes] == [[prompt + k] for k in range(1, 5)]
    assert all(r.execute_s >= 0.002 for r in records)  # the sim executor's step


def body_model(daemon) -> str:
    return daemon.get_json("/v1/models")[1]["data"][0]["id"]


def test_the_loop_reports_the_share_of_cpu_time_the_hypervisor_stole():
    from bench.studies.measured_loop import cpu_times, steal_pct
    before = [100, 0, 50, 800, 0, 0, 0, 10, 0, 0]
    after = [300, 0, 90, 1300, 0, 0, 0, 30, 0, 0]  # 760 ticks, 20 of them stolen
    assert steal_pct(before, after) == round(100 * 20 / 760, 2)
    assert steal_pct([], after) is None and steal_pct(before, before) is None
    now = cpu_times()  # /proc/stat where there is one
    assert now == [] or (len(now) >= 8 and all(x >= 0 for x in now))
