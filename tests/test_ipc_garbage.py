"""Garbage on the ZeroMQ sockets, both directions, against real processes: every bad
frame is logged and dropped, and the process stays up and keeps serving.

* instance -> controller: a rogue process (same user: it can reach the 0700 runtime
  directory) connects to a running daemon's controller socket and sends malformed
  frames, multi-part messages, impostors claiming the real instance's id and
  well-formed messages about instances and requests that do not exist.
* controller -> instance: every malformed command of test_ipc, and multi-part
  messages, sent to a real instance process (test_instance's harness).

Covers: ipc/codec.py, ipc/channel.py.
"""
from __future__ import annotations

import os
import stat

import msgspec
import pytest
import zmq

from ipc.codec import Encoder
from ipc.messages import (
    Finished, Heartbeat, InstanceFailed, Offload, OffloadedRequest, Ping, Ready, RequestError,
    StepOutputs, StepTokens, Submit, Ticket, TokenOutput,
)
from ipc.params import SamplingParams
from tests.daemon_fixture import sim_args, wait_for
from tests.test_instance import INSTANCE_ID, runtime_dir, start  # noqa: F401 (fixtures)
from tests.test_ipc import BAD_FRAMES

ENCODE = Encoder().encode


def raw(**fields) -> bytes:
    return msgspec.msgpack.encode(fields)


STEP = StepOutputs(instance_id=0, step=1, time=1.0, step_seconds=0.01,
                   tokens=StepTokens.of([TokenOutput("cmpl-x", 5, "length")]))
#: Frames the controller must drop as malformed (each logged "dropped a malformed").
MALFORMED_TO_CONTROLLER = {
    "garbage": b"\x00\xffnot msgpack at all",
    "empty": b"",
    "truncated": ENCODE(STEP)[:-4],
    "trailing bytes": ENCODE(STEP) + b"\x00",
    "not a map": msgspec.msgpack.encode([1, 2, 3]),
    "no tag": raw(instance_id=0, time=1.0),
    "unknown tag": raw(type="launch_missiles", instance_id=0),
    "a command sent the wrong way": ENCODE(Submit(request_id="r", prompt_token_ids=[1],
                                                  sampling=SamplingParams(), arrival_time=0.0)),
    "a ping sent the wrong way": ENCODE(Ping(ping_id=1)),
    "wrong field type": raw(type="heartbeat", instance_id="zero", time=1.0),
    "negative count": raw(type="heartbeat", instance_id=0, time=1.0, num_waiting=-1),
    "bad tokens": raw(type="step_outputs", instance_id=0, step=1, time=1.0, step_seconds=0.0,
                      tokens="tokens"),
    "ragged token columns": raw(type="step_outputs", instance_id=0, step=1, time=1.0,
                                step_seconds=0.0, tokens=[["a", "b"], [1], {}, {}]),
    "a finish past the tokens": raw(type="step_outputs", instance_id=0, step=1, time=1.0,
                                    step_seconds=0.0, tokens=[["a"], [1], {1: "stop"}, {}]),
    "missing field": raw(type="finished", instance_id=0),
    "unknown field": raw(type="ticket", instance_id=0, extra=1),
    "a big random frame": os.urandom(1 << 20),
}
#: Well-formed messages from the rogue's own id that claim to be instance 0: impostors.
IMPOSTORS = [STEP, Heartbeat(instance_id=0, time=1.0),
             Finished(instance_id=0, request_id="cmpl-x", reason="abort"),
             Ready(instance_id=0, role="peer", mode="sarathi", executor="sim", pid=1,
                   num_kv_blocks=1, block_size=16, max_model_len=8)]
#: Well-formed messages from "instance-77", which does not exist, about nothing that exists.
GHOST_ID = 77
GHOSTS = [Ready(instance_id=GHOST_ID, role="hp", mode="hp", executor="sim", pid=1,
                num_kv_blocks=1, block_size=16, max_model_len=8),
          Heartbeat(instance_id=GHOST_ID, time=1.0, num_waiting=10**6),
          StepOutputs(instance_id=GHOST_ID, step=1, time=1.0, step_seconds=0.0,
                      tokens=StepTokens.of([TokenOutput("no-such-request", 1, "stop")])),
          Finished(instance_id=GHOST_ID, request_id="no-such-request", reason="abort"),
          RequestError(instance_id=GHOST_ID, request_id="no-such-request", message="x"),
          Offload(instance_id=GHOST_ID, requests=[OffloadedRequest("no-such-request", [1, 2])]),
          Ticket(instance_id=GHOST_ID),
          InstanceFailed(instance_id=GHOST_ID, message="a ghost's last words")]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, daemon_cache, tiny_models):
    from tests.daemon_fixture import start_daemon
    d = start_daemon(tmp_path_factory.mktemp("garbage-daemon"), "--model",
                     str(tiny_models["llama"]), *sim_args(), cache_dir=daemon_cache)
    yield d
    d.close()


def socket_dir(daemon) -> str:
    return str(daemon.runtime_dir)  # start_daemon's --runtime-dir


@pytest.mark.slow
def test_the_daemons_runtime_dir_is_private(daemon):
    path = socket_dir(daemon)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert os.stat(path).st_uid == os.getuid()
    assert stat.S_ISSOCK(os.stat(os.path.join(path, "controller.sock")).st_mode)


def _dealer(context: zmq.Context, daemon, identity: bytes) -> zmq.Socket:
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.ROUTING_ID, identity)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(f"ipc://{socket_dir(daemon)}/controller.sock")
    return sock


@pytest.mark.slow
def test_garbage_to_the_controller_is_logged_and_dropped_and_the_daemon_serves(daemon):
    status, before = daemon.post_json("/v1/completions", {"prompt": "Hi", "max_tokens": 3})
    assert status == 200
    context = zmq.Context()
    try:
        rogue, ghost = _dealer(context, daemon, b"rogue"), _dealer(context, daemon,
                                                                   b"instance-%d" % GHOST_ID)
        for frame in MALFORMED_TO_CONTROLLER.values():
            rogue.send(frame)
        rogue.send_multipart([b"two", b"parts"])
        rogue.send_multipart([ENCODE(STEP), ENCODE(STEP), b"x"])
        for message in IMPOSTORS:
            rogue.send(ENCODE(message))
        for message in GHOSTS:
            ghost.send(ENCODE(message))
        rogue.close()
        ghost.close()
    finally:
        context.term()  # LINGER: returns once the frames are handed over

    def dropped_everything():
        log = daemon.log()
        return (log.count("dropped a malformed instance->controller frame")
                >= len(MALFORMED_TO_CONTROLLER)
                and log.count("-part message from") >= 2
                and log.count("claiming instance 0") >= len(IMPOSTORS)
                and "a ghost's last words" in log)

    wait_for(dropped_everything, 15, what="the controller to log every bad frame")
    # Up, healthy, the real instance untouched, and serving the same answers as before.
    assert daemon.proc.poll() is None
    health = daemon.health()
    assert health["status"] == "ok" and health["requests_in_flight"] == 0
    [instance] = health["instances"]
    assert instance["state"] == "ready" and instance["restarts"] == 0 and instance["id"] == 0
    for _ in range(3):
        status, after = daemon.post_json("/v1/completions", {"prompt": "Hi", "max_tokens": 3})
        assert status == 200 and after["choices"][0]["text"] == before["choices"][0]["text"]
    stream_status, _, raw_stream = daemon.request(
        "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 3, "stream": True})
    assert stream_status == 200 and raw_stream.endswith(b"data: [DONE]\n\n")
    assert "Traceback" not in daemon.log()


async def test_garbage_to_an_instance_process_is_dropped_and_it_serves_on(start):  # noqa: F811
    harness = await start()
    for frame in BAD_FRAMES.values():
        await harness.channel.send_frame(INSTANCE_ID, frame)
    sock = harness.channel._sock  # multi-part messages: commands are one frame
    rid = b"instance-%d" % INSTANCE_ID
    await sock.send_multipart([rid, ENCODE(Ping(ping_id=9)), ENCODE(Ping(ping_id=9))])
    await sock.send_multipart([rid, b"a", b"b", b"c"])
    await harness.submit("after", max_tokens=3)
    assert (await harness.run_to_completion(["after"]))["after"] == ([0, 0, 0], "length")
    assert (await harness.stats()).num_bad_frames == len(BAD_FRAMES) + 2
    assert harness.proc.poll() is None
    assert not [m for m in harness.seen if isinstance(m, InstanceFailed)]
