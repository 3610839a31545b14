"""The sim executor: latency functions by name, virtual sleep, requests end at max_tokens.

Covers: engines/executors/sim_executor.py, engines/executors/build.py.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from engines.executors.build import build_executor

from engines.executors.executor_config import ExecutorConfig
from engines.offline import Offline
from engines.executors.latency import (
    constant_latency, make_latency, zero_latency,
)
from engines.executors.sim_executor import SimExecutor
from engines.instance_launch import PROJECT_ROOT
from engines.scheduler import SchedulerConfig
from ipc.params import SamplingParams


def test_latency_specs():
    assert make_latency("zero") is zero_latency
    assert make_latency("constant:0.25")(None) == 0.25
    for bad in ("constant", "constant:-1", "constant:x", "zero:1", "gpu-profile"):
        with pytest.raises(ValueError):
            make_latency(bad)


def test_every_request_ends_exactly_at_max_tokens_and_time_is_charged():
    slept = []
    executor = SimExecutor(constant_latency(0.5), num_kv_blocks=32, block_size=4,
                           max_model_len=64, sleep=slept.append)
    offline = Offline(executor, SchedulerConfig(chunk_size=16))
    prompts = [[1] * n for n in (3, 10, 20, 40)]
    params = [SamplingParams(max_tokens=m, stop_token_ids=[0, 1]) for m in (1, 7, 30, 50)]
    done = offline.generate(prompts, params)
    assert [len(c.token_ids) for c in done] == [1, 7, 30, 24]  # the last hits max_model_len 64
    assert all(c.finish_reason == "length" for c in done)
    assert all(t not in (0, 1) for c in done for t in c.token_ids)  # never a stop token
    assert slept == [0.5] * len(slept) and executor.busy_time == 0.5 * len(slept)


def test_zero_latency_never_sleeps():
    executor = SimExecutor(zero_latency, sleep=lambda s: pytest.fail("slept"))
    done = Offline(executor, SchedulerConfig()).generate([[5, 6]], SamplingParams(max_tokens=3))
    assert done[0].token_ids == [0, 0, 0]


def test_sim_path_never_imports_torch():
    code = ("import sys; from engines.executors.build import build_executor; "
            "from engines.executors.executor_config import ExecutorConfig; "
            "import engines.instance_main, engines.instance, engines.instance_launch; "
            "build_executor(ExecutorConfig(kind='sim')); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=PROJECT_ROOT)


def test_build_sim_executor_from_config():
    executor = build_executor(ExecutorConfig(kind="sim", num_kv_blocks=10, block_size=8,
                                             max_model_len=100, latency="constant:0.1"))
    assert (executor.num_kv_blocks, executor.block_size, executor.max_model_len) == (10, 8, 100)
    assert executor.latency_fn(None) == 0.1
