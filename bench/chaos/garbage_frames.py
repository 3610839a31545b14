"""Garbage on the wire: messages no instance would send, for the controller's ZeroMQ
socket (`ascendra chaos` checks they are logged and dropped, never fatal)."""
from __future__ import annotations

import os
import random
from pathlib import Path

import msgspec
import zmq


def garbage_frames() -> list[list[bytes]]:
    """Messages no instance would send: random bytes, truncated or mistyped msgpack, a
    well-formed message from an identity that is no instance, an extra frame."""
    rng = random.Random(7)
    fake_tokens = {"type": "step_outputs", "instance_id": 0, "step": 1, "time": 0.0,
                   "step_seconds": 0.0, "tokens": [["cmpl-not-a-request"], [1], {0: "stop"}, {}]}
    return [
        [bytes(rng.randrange(256) for _ in range(512))],
        [b"\xc1"],                                                   # never-used msgpack byte
        [msgspec.msgpack.encode({"type": "ready"})],                 # missing fields
        [msgspec.msgpack.encode({"type": "no_such_message", "instance_id": 0})],
        [msgspec.msgpack.encode(fake_tokens)],                       # claims to be instance 0
        [msgspec.msgpack.encode(fake_tokens)[:-3]],                  # truncated
        [b"one", b"two"],                                            # two frames
        [b""],
    ]


def send_garbage(runtime_dir: Path) -> int:
    """Connect as a stranger (never an instance's id) and send garbage_frames(); returns
    how many messages went out."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.ROUTING_ID, b"chaos-%d" % os.getpid())
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(f"ipc://{runtime_dir}/controller.sock")
    frames = garbage_frames()
    for message in frames:
        sock.send_multipart(message)
    sock.close()
    ctx.term()
    return len(frames)
