"""`serve --torch-threads N` (instances.torch_threads): each instance process's torch
threads, set in the instance's executor config and applied when its executor is built
(and by `ascendra profile`); a bad value is a config error naming the field.

Covers: daemon/config.py, daemon/serve_cmd.py, engines/executors/build.py, engines/executors/executor_config.py, bench/profiling/host_timing.py.
"""
from __future__ import annotations

import argparse

import pytest
import torch

from bench.profiling.host_timing import serve_args
from daemon.config import add_config_flags, config_from_args, load_config
from daemon.serve_cmd import instance_configs
from engines.executors.build import build_executor
from engines.executors.executor_config import ExecutorConfig


def _config(*flags: str):
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    return config_from_args(parser.parse_args(list(flags)))


def test_the_flag_reaches_every_instance_process_config(tmp_path):
    config = _config("--layout", "2xsarathi", "--torch-threads", "1", "--device", "cpu")
    assert config.instances.torch_threads == 1
    (plan,) = config.model_plans()
    configs = instance_configs(config, plan, "ipc:///tmp/x.sock", tmp_path)
    assert [c.executor.torch_threads for c in configs] == [1, 1]


def test_unset_it_leaves_torch_its_default(tmp_path):
    config = _config("--layout", "1xsarathi")
    (plan,) = config.model_plans()
    (instance,) = instance_configs(config, plan, "ipc:///tmp/x.sock", tmp_path)
    assert config.instances.torch_threads == 0 == instance.executor.torch_threads


def test_a_bad_value_is_a_config_error_naming_the_field():
    with pytest.raises(ValueError, match=r"instances\.torch_threads"):
        load_config(overrides={"torch_threads": -1})
    with pytest.raises(ValueError, match="torch_threads: only the torch executor"):
        load_config(overrides={"executor": "sim", "torch_threads": 2})


def test_the_executor_built_in_the_instance_process_runs_on_that_many_threads():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        build_executor(ExecutorConfig(kind="torch", device="cpu", num_kv_blocks=64,
                                      max_model_len=256, torch_threads=1))
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        build_executor(ExecutorConfig(kind="torch", device="cpu", num_kv_blocks=64,
                                      max_model_len=256))  # 0: left as it was
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_profile_commands_live_daemon_gets_the_same_threads():
    args = serve_args("m", "cpu", 16, 2048, 1024, 512, 32, tp=1, torch_threads=1)
    assert args[args.index("--torch-threads") + 1] == "1"
