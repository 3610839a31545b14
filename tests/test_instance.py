"""A real instance process (sim executor) over real ipc:// sockets, driven like the controller.

Covers: engines/instance.py, engines/instance_main.py, engines/instance_launch.py.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import msgspec
import pytest

from engines.executors.executor_config import ExecutorConfig
from engines.instance import EXIT_CONTROLLER_LOST, EXIT_FAILED
from engines.instance_config import InstanceConfig
from engines.instance_launch import PROJECT_ROOT, spawn_instance
from engines.scheduler import SchedulerConfig
from ipc.channel import ControllerChannel, make_runtime_dir
from ipc.codec import Encoder
from ipc.messages import (
    Abort, Finished, Heartbeat, InstanceFailed, Ping, Ready, RequestError, Shutdown,
    StepOutputs, Submit,
)
from ipc.params import SamplingParams

TIMEOUT = 10.0  # generous: a loaded CI box may start Python slowly
INSTANCE_ID = 4


class Harness:
    """The controller's side of one instance: its channel and process, and message helpers."""

    def __init__(self, channel: ControllerChannel, proc: subprocess.Popen) -> None:
        self.channel = channel
        self.proc = proc
        self.seen: list = []
        self._pings = itertools.count(1)

    async def recv(self):
        message, frames = await asyncio.wait_for(self.channel.recv(), TIMEOUT)
        assert not frames  # only a P/D hand-off carries KV frames
        self.seen.append(message)
        return message

    async def recv_until(self, predicate) -> list:
        """Messages up to and including the first that `predicate` accepts."""
        got = []
        while True:
            got.append(await self.recv())
            if predicate(got[-1]):
                return got

    async def send(self, message) -> None:
        await self.channel.send(INSTANCE_ID, message)

    async def submit(self, request_id: str, prompt_len: int = 8, **sampling) -> None:
        prompt = list(range(1, prompt_len + 1))
        await self.send(Submit(request_id=request_id, prompt_token_ids=prompt,
                               sampling=SamplingParams(**sampling), arrival_time=time.monotonic()))

    async def stats(self) -> Heartbeat:
        """Stats taken after every command sent so far was applied."""
        ping_id = next(self._pings)
        await self.send(Ping(ping_id=ping_id))
        got = await self.recv_until(lambda m: isinstance(m, Heartbeat) and m.ping_id == ping_id)
        return got[-1]

    async def run_to_completion(self, request_ids) -> dict:
        """request id -> (tokens, terminal message or finish reason), in arrival order."""
        results = {rid: ([], None) for rid in request_ids}
        open_ids = set(request_ids)
        while open_ids:
            message = await self.recv()
            if isinstance(message, StepOutputs):
                for out in message.tokens.outputs():
                    tokens, _ = results[out.request_id]
                    assert out.request_id in open_ids, f"token after the end: {out}"
                    tokens.append(out.token_id)
                    if out.finish_reason is not None:
                        results[out.request_id] = (tokens, out.finish_reason)
                        open_ids.discard(out.request_id)
            elif isinstance(message, (Finished, RequestError)):
                assert message.request_id in open_ids
                results[message.request_id] = (results[message.request_id][0], message)
                open_ids.discard(message.request_id)
        return results

    async def wait_exit(self) -> int:
        return await asyncio.wait_for(asyncio.to_thread(self.proc.wait), TIMEOUT)


def sim_config(endpoint: str, latency: str = "zero", **overrides) -> InstanceConfig:
    return InstanceConfig(
        instance_id=INSTANCE_ID, endpoint=endpoint,
        scheduler=SchedulerConfig(mode="sarathi", chunk_size=64),
        executor=ExecutorConfig(kind="sim", latency=latency, num_kv_blocks=32, block_size=8,
                                max_model_len=128),
        **overrides)


@pytest.fixture
def runtime_dir():
    path = make_runtime_dir(tempfile.mkdtemp(prefix="asc-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def start(runtime_dir):
    """start(latency=..., **config) -> a Harness whose instance has sent its first message
    (`harness.ready`: Ready, or InstanceFailed if it could not start)."""
    channel = ControllerChannel(runtime_dir)
    procs = []

    async def _start(latency: str = "zero", **overrides) -> Harness:
        proc = spawn_instance(sim_config(channel.endpoint, latency, **overrides))
        procs.append(proc)
        harness = Harness(channel, proc)
        harness.ready = await harness.recv()
        return harness

    yield _start
    channel.close()
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


async def test_ready_reports_role_and_kv_capacity(start):
    harness = await start()
    assert harness.ready == Ready(instance_id=INSTANCE_ID, role="peer", mode="sarathi",
                                  executor="sim", pid=harness.proc.pid, num_kv_blocks=32,
                                  block_size=8, max_model_len=128, token_budget=64,
                                  prefix_caching=True)


async def test_requests_stream_tokens_and_end_at_max_tokens(start):
    harness = await start()
    lengths = {"a": 1, "b": 5, "c": 12, "d": 30}
    for rid, max_tokens in lengths.items():
        await harness.submit(rid, prompt_len=3 + max_tokens, max_tokens=max_tokens)
    results = await harness.run_to_completion(lengths)
    for rid, (tokens, reason) in results.items():
        assert len(tokens) == lengths[rid] and reason == "length"
    stats = await harness.stats()
    assert (stats.num_waiting, stats.num_running, stats.num_kv_blocks_used) == (0, 0, 0)
    assert stats.num_steps >= 30 and stats.num_kv_blocks == 32


async def test_one_step_outputs_message_per_step_with_many_requests(start):
    harness = await start(latency="constant:0.01")
    ids = [f"r{i}" for i in range(4)]
    for rid in ids:
        await harness.submit(rid, max_tokens=20)
    await harness.run_to_completion(ids)
    steps = [m for m in harness.seen if isinstance(m, StepOutputs)]
    numbers = [m.step for m in steps]
    assert numbers == sorted(set(numbers)), "one message per step"
    for message in steps:
        in_step = [o.request_id for o in message.tokens.outputs()]
        assert len(in_step) == len(set(in_step)), "one token per request per step"
        assert message.step_seconds >= 0.01 and message.instance_id == INSTANCE_ID
    assert max(len(m.tokens.outputs()) for m in steps) == 4


async def test_abort_frees_the_request_and_its_blocks(start):
    harness = await start(latency="constant:0.01")
    await harness.submit("long", prompt_len=40, max_tokens=80)
    await harness.recv_until(lambda m: isinstance(m, StepOutputs))
    assert (await harness.stats()).num_kv_blocks_used > 0
    await harness.send(Abort(request_id="long"))
    await harness.send(Abort(request_id="never-submitted"))  # ignored: nothing to answer
    stats = await harness.stats()
    after_abort = harness.seen[harness.seen.index(Finished(
        instance_id=INSTANCE_ID, request_id="long", reason="abort")) + 1:]
    assert not any(isinstance(m, StepOutputs) for m in after_abort), "tokens after the abort"
    assert [type(m) for m in after_abort if not isinstance(m, Heartbeat)] == []
    assert (stats.num_running, stats.num_waiting, stats.num_kv_blocks_used) == (0, 0, 0)


async def test_refused_submits_get_a_request_error_and_the_instance_serves_on(start):
    harness = await start(latency="constant:0.005")  # "ok" lives 0.1 s: the duplicate meets it
    await harness.submit("too-long", prompt_len=200)  # the context limit is 128
    await harness.submit("ok", max_tokens=20)
    await harness.submit("ok", max_tokens=20)  # a duplicate id while "ok" is alive
    got = await harness.recv_until(
        lambda m: isinstance(m, StepOutputs) and m.tokens.outputs()[-1].finish_reason == "length")
    errors = {m.request_id: m.message for m in got if isinstance(m, RequestError)}
    assert "128" in errors["too-long"] and "duplicate" in errors["ok"]
    tokens = [o.token_id for m in got if isinstance(m, StepOutputs) for o in m.tokens.outputs()]
    assert tokens == [0] * 20
    assert harness.proc.poll() is None


async def test_garbage_frames_are_dropped_and_the_instance_keeps_serving(start):
    harness = await start()
    encoder = Encoder()
    bad = [b"\xc1 garbage", msgspec.msgpack.encode({"type": "launch"}),
           msgspec.msgpack.encode({"type": "abort", "request_id": 7}),
           encoder.encode(harness.ready)]  # a controller-bound message sent the wrong way
    for frame in bad:
        await harness.channel.send_frame(INSTANCE_ID, frame)
    await harness.submit("after", max_tokens=2)
    assert (await harness.run_to_completion(["after"]))["after"] == ([0, 0], "length")
    assert (await harness.stats()).num_bad_frames == len(bad)


async def test_shutdown_aborts_what_is_left_and_exits_zero(start):
    harness = await start(latency="constant:0.01")
    await harness.submit("running", max_tokens=100)
    await harness.recv_until(lambda m: isinstance(m, StepOutputs))
    await harness.send(Shutdown())
    results = await harness.run_to_completion(["running"])
    assert results["running"][1].reason == "abort"
    assert await harness.wait_exit() == 0


async def test_sigterm_exits_zero(start):
    harness = await start()
    harness.proc.send_signal(signal.SIGTERM)
    assert await harness.wait_exit() == 0


@pytest.mark.slow
async def test_exits_when_the_controller_stops_pinging(start):
    harness = await start(controller_timeout=0.6, heartbeat_interval=0.1)
    for _ in range(8):  # 0.8 s alive while pinged
        await harness.send(Ping())
        await asyncio.sleep(0.1)
    assert harness.proc.poll() is None
    assert await harness.wait_exit() == EXIT_CONTROLLER_LOST


async def test_a_failed_start_is_reported_then_exits_non_zero(start):
    harness = await start(latency="no-such-latency")
    assert isinstance(harness.ready, InstanceFailed) and "no-such-latency" in harness.ready.message
    assert await harness.wait_exit() == EXIT_FAILED


def proc_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has exited
    except FileNotFoundError:
        return True


@pytest.mark.slow
async def test_exits_when_its_parent_dies(runtime_dir):
    channel = ControllerChannel(runtime_dir)
    config = sim_config(channel.endpoint)
    # A middle process starts the instance, then is killed: the instance is orphaned.
    code = ("import sys; from engines.instance_config import InstanceConfig; "
            "from engines.instance_launch import spawn_instance; "
            "spawn_instance(InstanceConfig.from_json(sys.argv[1])); "
            "import time; time.sleep(60)")
    middle = subprocess.Popen([sys.executable, "-c", code, config.to_json()], cwd=PROJECT_ROOT)
    try:
        ready, _ = await asyncio.wait_for(channel.recv(), TIMEOUT)
        assert isinstance(ready, Ready) and not proc_gone(ready.pid)
        middle.kill()
        middle.wait()
        deadline = time.monotonic() + TIMEOUT
        while not proc_gone(ready.pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        gone = proc_gone(ready.pid)
        if not gone:
            os.kill(ready.pid, signal.SIGKILL)
        assert gone, "the orphaned instance kept running"
    finally:
        if middle.poll() is None:
            middle.kill()
        channel.close()


def test_config_travels_as_json_and_a_bad_one_exits_2():
    config = sim_config("ipc:///tmp/asc/controller.sock", gpus=[2, 3], controller_timeout=5.0)
    assert InstanceConfig.from_json(config.to_json()) == config
    for bad in ('{"instance_id": 0, "endpoint": "tcp://127.0.0.1:5555"}',
                '{"instance_id": 0, "endpoint": "ipc:///x", "scheduler": {"mode": "nope"}}',
                '{"instance_id": "0", "endpoint": "ipc:///x"}'):
        with pytest.raises(ValueError):
            InstanceConfig.from_json(bad)
    proc = subprocess.run([sys.executable, "-m", "engines.instance_main", "--config-json", bad],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "instance_id" in proc.stderr


def test_gpus_are_pinned_with_cuda_visible_devices():
    from engines.instance_launch import instance_env
    base = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "PYTHONPATH": "/elsewhere"}
    endpoint = "ipc:///tmp/asc/controller.sock"
    assert instance_env(sim_config(endpoint, gpus=[2, 3]), base)["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert instance_env(sim_config(endpoint, gpus=[]), base)["CUDA_VISIBLE_DEVICES"] == ""
    env = instance_env(sim_config(endpoint), base)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert env["PYTHONPATH"] == f"{PROJECT_ROOT}{os.pathsep}/elsewhere"
