"""The wire: message round trips, strict decoding that drops bad frames, sockets, runtime dir.

Covers: ipc/messages.py, ipc/codec.py, ipc/channel.py.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import stat
import tempfile

import msgspec
import pytest

from ipc.channel import (
    ControllerChannel, InstanceChannel, InstanceUnreachable, ipc_endpoint, make_runtime_dir,
)
from ipc.codec import Encoder, controller_decoder, instance_decoder
from ipc.messages import (
    Abort, Finished, Handoff, Heartbeat, InstanceFailed, KvLayout, Origin, Ping, Ready,
    RequestError, Shutdown, StepOutputs, StepTokens, Submit, SubmitPrefilled, TokenOutput,
)
from ipc.params import SamplingParams

TO_INSTANCE = [
    Submit(request_id="r1", prompt_token_ids=[5, 6, 7],
           sampling=SamplingParams(max_tokens=9, temperature=0.7, seed=3, stop_token_ids=[2]),
           arrival_time=12.5, deadline=13.5, ttft_slo=1.0, tbt_slo=0.15, priority=2,
           origin=Origin.OFFLOAD),
    Submit(request_id="r2", prompt_token_ids=[1], sampling=SamplingParams(), arrival_time=0.0),
    Submit(request_id="r4", prompt_token_ids=[1], sampling=SamplingParams(), arrival_time=0.0,
           origin=Origin.RESCUE),
    Abort(request_id="r1"),
    Ping(ping_id=7),
    Shutdown(),
]
TO_CONTROLLER = [
    Ready(instance_id=1, role="peer", mode="sarathi", executor="sim", pid=42,
          num_kv_blocks=64, block_size=16, max_model_len=256),
    StepOutputs(instance_id=1, step=3, time=5.0, step_seconds=0.01,
                tokens=StepTokens.of([TokenOutput("r1", 11), TokenOutput("r2", 12, "length")])),
    Finished(instance_id=1, request_id="r1", reason="abort"),
    RequestError(instance_id=1, request_id="r3", message="prompt too long"),
    Heartbeat(instance_id=1, time=6.0, ping_id=7, num_waiting=1, num_running=2,
              num_kv_blocks_used=3, num_kv_blocks=64, num_preemptions=4, num_steps=5,
              num_bad_frames=6),
    InstanceFailed(instance_id=1, message="boom"),
]


@pytest.mark.parametrize("message", TO_INSTANCE, ids=lambda m: type(m).__name__)
def test_commands_round_trip(message):
    assert instance_decoder().decode(Encoder().encode(message)) == message


@pytest.mark.parametrize("message", TO_CONTROLLER, ids=lambda m: type(m).__name__)
def test_reports_round_trip(message):
    assert controller_decoder().decode(Encoder().encode(message)) == message


def test_deadline_may_be_infinite():
    message = Submit(request_id="r", prompt_token_ids=[1], sampling=SamplingParams(),
                     arrival_time=1.0, deadline=float("inf"))
    assert instance_decoder().decode(Encoder().encode(message)).deadline == float("inf")


def raw(**fields) -> bytes:
    return msgspec.msgpack.encode(fields)


GOOD_SUBMIT = dict(type="submit", request_id="r", prompt_token_ids=[1, 2],
                   sampling={"max_tokens": 4}, arrival_time=1.0)

BAD_FRAMES = {
    "garbage": b"\x00\xffnot msgpack at all",
    "empty": b"",
    "truncated": Encoder().encode(TO_INSTANCE[0])[:-3],
    "trailing bytes": Encoder().encode(Ping()) + b"\x00",
    "not a map": msgspec.msgpack.encode([1, 2, 3]),
    "no tag": raw(request_id="r"),
    "unknown tag": raw(type="launch_missiles"),
    "wrong direction": Encoder().encode(TO_CONTROLLER[0]),
    "wrong field type": raw(**{**GOOD_SUBMIT, "request_id": 5}),
    "string token id": raw(**{**GOOD_SUBMIT, "prompt_token_ids": ["1"]}),
    "negative token id": raw(**{**GOOD_SUBMIT, "prompt_token_ids": [-1]}),
    "empty prompt": raw(**{**GOOD_SUBMIT, "prompt_token_ids": []}),
    "bad sampling": raw(**{**GOOD_SUBMIT, "sampling": {"max_tokens": 0}}),
    "missing field": raw(type="submit", request_id="r"),
    "unknown field": raw(type="abort", request_id="r", extra=1),
    "unknown origin": raw(**{**GOOD_SUBMIT, "origin": "rescued"}),
}


@pytest.mark.parametrize("frame", BAD_FRAMES.values(), ids=BAD_FRAMES.keys())
def test_bad_frames_decode_to_none_and_the_decoder_keeps_working(frame, caplog):
    decoder = instance_decoder()
    assert decoder.decode(frame) is None
    assert decoder.num_bad_frames == 1
    assert "dropped a malformed" in caplog.text
    assert decoder.decode(raw(**GOOD_SUBMIT)) == Submit(
        request_id="r", prompt_token_ids=[1, 2], sampling=SamplingParams(max_tokens=4),
        arrival_time=1.0)


# ---- runtime directory ----------------------------------------------------------------------

@pytest.fixture
def scratch():
    path = tempfile.mkdtemp(prefix="asc-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_runtime_dir_is_created_private(scratch):
    path = make_runtime_dir(os.path.join(scratch, "run", "ascendra"))
    assert path.is_dir() and mode_of(path) == 0o700


def test_runtime_dir_with_a_wider_mode_is_tightened(scratch):
    path = os.path.join(scratch, "wide")
    os.mkdir(path)
    os.chmod(path, 0o755)
    assert mode_of(make_runtime_dir(path)) == 0o700


def test_runtime_dir_refuses_a_symlink(scratch):
    target = os.path.join(scratch, "real")
    os.mkdir(target, 0o700)
    link = os.path.join(scratch, "link")
    os.symlink(target, link)
    with pytest.raises(PermissionError):
        make_runtime_dir(link)


def test_runtime_dir_honours_systemd(scratch, monkeypatch):
    monkeypatch.setenv("RUNTIME_DIRECTORY", os.path.join(scratch, "sd"))
    path = make_runtime_dir()
    assert str(path) == os.path.join(scratch, "sd") and mode_of(path) == 0o700


def test_runtime_dir_default_is_a_fresh_private_temp_dir(monkeypatch):
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    path = make_runtime_dir()
    try:
        assert mode_of(path) == 0o700
    finally:
        path.rmdir()


def test_endpoint_is_ipc_and_refuses_overlong_paths(scratch):
    assert ipc_endpoint(scratch) == f"ipc://{scratch}/controller.sock"
    with pytest.raises(ValueError, match="longer than"):
        ipc_endpoint("/tmp/" + "x" * 120)
    with pytest.raises(ValueError, match="ipc://"):
        InstanceChannel("tcp://127.0.0.1:5555", 0)


# ---- sockets ------------------------------------------------------------------------------

@pytest.fixture
async def controller(scratch):
    channel = ControllerChannel(make_runtime_dir(scratch))
    yield channel
    channel.close()


@pytest.fixture
async def instance(controller):
    channel = InstanceChannel(controller.endpoint, instance_id=3)
    yield channel
    channel.close()


async def recv(controller: ControllerChannel):
    message, frames = await asyncio.wait_for(controller.recv(), 5.0)
    assert frames == ()
    return message


async def drain(instance: InstanceChannel, timeout: float = 2.0):
    received = await asyncio.to_thread(instance.drain, timeout)
    assert all(frames == () for _, frames in received)
    return [message for message, _ in received]


async def test_a_handoffs_kv_frames_come_with_its_message_both_ways(controller, instance):
    layout = KvLayout(num_layers=2, num_blocks=1, block_size=16, num_kv_heads=2, head_dim=8,
                      dtype="float32", num_tokens=3)
    handoff = Handoff(instance_id=3, request_id="a", token_ids=[1, 2, 3, 4],
                      num_computed_tokens=3, kv=layout)
    instance.send(handoff, [b"layer0", b"layer1"])
    message, frames = await asyncio.wait_for(controller.recv(), 5.0)
    assert message == handoff and [f.bytes for f in frames] == [b"layer0", b"layer1"]
    prefilled = SubmitPrefilled(submit=Submit(request_id="a", prompt_token_ids=[1, 2, 3],
                                              sampling=SamplingParams(), arrival_time=0.0),
                                token_ids=[1, 2, 3, 4], num_computed_tokens=3, kv=layout)
    await controller.send(3, prefilled, frames)
    await controller.send(3, Ping(ping_id=1))
    received = []
    while len(received) < 2:
        received += await asyncio.to_thread(instance.drain, 2.0)
    (got, kv), (ping, none) = received
    assert got == prefilled and [bytes(f) for f in kv] == [b"layer0", b"layer1"]
    assert ping == Ping(ping_id=1) and none == ()


async def test_messages_flow_both_ways(controller, instance):
    instance.send(msgspec.structs.replace(TO_CONTROLLER[0], instance_id=3))
    assert isinstance(await recv(controller), Ready)
    for message in TO_INSTANCE:
        await controller.send(3, message)
    got = []
    while len(got) < len(TO_INSTANCE):
        got += await drain(instance)
    assert got == TO_INSTANCE


async def test_send_to_an_unconnected_instance_fails_at_once(controller):
    with pytest.raises(InstanceUnreachable):
        await controller.send(9, Ping())


async def test_instance_drops_garbage_frames_and_keeps_serving(controller, instance):
    instance.send(Heartbeat(instance_id=3, time=0.0))
    await recv(controller)  # the connection is up
    for frame in BAD_FRAMES.values():
        await controller.send_frame(3, frame)
    await controller.send(3, Ping(ping_id=1))
    got = []
    while not got:
        got += await drain(instance)
    assert got == [Ping(ping_id=1)]
    assert instance.num_bad_frames == len(BAD_FRAMES)


async def test_controller_drops_garbage_and_impostors(controller, instance):
    instance._sock.send(b"garbage")
    instance._sock.send_multipart([b"two", b"frames"])
    instance.send(Heartbeat(instance_id=4, time=0.0))  # claims to be another instance
    instance.send(Heartbeat(instance_id=3, time=1.0))
    assert await recv(controller) == Heartbeat(instance_id=3, time=1.0)
    assert controller.num_bad_frames == 3


async def test_closing_the_controller_socket_removes_its_file(scratch):
    """ZeroMQ leaves an ipc socket's file behind; a clean stop must not (issue #62: each
    run left /tmp/ascendra-XXXX/controller.sock)."""
    channel = ControllerChannel(make_runtime_dir(scratch))
    path = channel.endpoint.removeprefix("ipc://")
    assert os.path.exists(path)
    channel.close()
    assert not os.path.exists(path)
