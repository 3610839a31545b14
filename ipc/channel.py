"""ZeroMQ plumbing between the controller and its instances.

Pattern: ONE socket pair per instance, over ONE `ipc://` path.

* The controller binds a ROUTER socket at `<runtime_dir>/controller.sock`
  (`ControllerChannel`, asyncio).
* Each instance connects a DEALER socket to it (`InstanceChannel`, blocking API for
  the engine loop) whose routing id names the instance (`routing_id(instance_id)`).

Why ROUTER/DEALER rather than PUSH/PULL pairs: one path and one socket on the
controller; replies need no second connection; ROUTER_MANDATORY makes a send to an
instance that is not connected fail at once (`InstanceUnreachable`) instead of
queueing commands for a dead process; ROUTER_HANDOVER lets a restarted instance
take its id back. The DEALER is the connecting side, so the instance's first
message (Ready) is queued until the connection is up and never lost; the controller
may send to an instance once its Ready has arrived.

Frames: instance -> controller is one msgpack frame (the ROUTER prepends the routing
id); controller -> instance is one msgpack frame. The one exception is a P/D hand-off's
KV cache: a `Handoff` (instance -> controller) or `SubmitPrefilled` (controller ->
instance) whose `kv` header is set is followed by exactly `kv.num_layers` raw frames,
sent and passed on without a copy. Both ends receive (message, frames) pairs -- frames
empty for every other message -- so a driver gets a hand-off's KV with its message.
Anything else is dropped and logged.

Safety: sockets live in a private runtime directory (mode 0700, `make_runtime_dir`);
frames over `max_frame_bytes` are refused by ZeroMQ; LINGER is bounded, so closing
never hangs on a peer that has gone away.
"""
from __future__ import annotations

import errno
import logging
import os
import stat
import tempfile
from pathlib import Path

import msgspec
import zmq
import zmq.asyncio

from ipc.codec import Encoder, controller_decoder, instance_decoder
from ipc.messages import Handoff, SubmitPrefilled, ToController, ToInstance

#: The frames of a message that has none after it.
NO_FRAMES: tuple = ()

log = logging.getLogger(__name__)

#: Longest socket path the kernel accepts (sun_path is 108 bytes with its NUL).
MAX_SOCKET_PATH = 107
CONTROLLER_SOCKET = "controller.sock"
DEFAULT_MAX_FRAME_BYTES = 64 << 20
#: How long closing an instance socket may wait to flush its last messages.
INSTANCE_LINGER_MS = 500
#: Commands the controller may queue for one instance before sends fail.
CONTROLLER_SNDHWM = 100_000


class InstanceUnreachable(RuntimeError):
    """The controller could not hand a message to an instance (not connected, or stuck)."""


# ---- the runtime directory ----------------------------------------------------------------

def make_runtime_dir(base: str | os.PathLike | None = None) -> Path:
    """The private directory for the sockets: `base`, else systemd's `$RUNTIME_DIRECTORY`,
    else a fresh temporary directory. Created mode 0700; an existing directory of ours
    with a wider mode is tightened to 0700; one owned by someone else, or a symlink, is
    refused (PermissionError)."""
    if base is None:
        systemd_dirs = os.environ.get("RUNTIME_DIRECTORY", "")
        base = systemd_dirs.split(":")[0] or None
    if base is None:
        parent = os.environ.get("XDG_RUNTIME_DIR") or None
        if parent is not None and not os.path.isdir(parent):
            parent = None
        return Path(tempfile.mkdtemp(prefix="ascendra-", dir=parent))  # mkdtemp: 0700
    path = Path(base)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _secure_dir(path)
    return path


def _secure_dir(path: Path) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"runtime dir {path} is not a plain directory")
    if st.st_uid != os.geteuid():
        raise PermissionError(f"runtime dir {path} belongs to uid {st.st_uid}, not to us")
    if stat.S_IMODE(st.st_mode) & 0o077:
        log.warning("runtime dir %s had mode %o; tightening to 0700",
                    path, stat.S_IMODE(st.st_mode))
        os.chmod(path, 0o700)


def ipc_endpoint(runtime_dir: str | os.PathLike, name: str = CONTROLLER_SOCKET) -> str:
    """`ipc://<runtime_dir>/<name>`, refusing paths the kernel would cut short."""
    path = os.path.join(os.fspath(runtime_dir), name)
    if len(path.encode()) > MAX_SOCKET_PATH:
        raise ValueError(f"socket path {path!r} is longer than {MAX_SOCKET_PATH} bytes; "
                         "use a shorter runtime directory")
    return "ipc://" + path


def routing_id(instance_id: int) -> bytes:
    """The ZeroMQ routing id of instance `instance_id` on the controller's ROUTER."""
    return b"instance-%d" % instance_id


def _instance_id_of(ident: bytes) -> int | None:
    prefix = b"instance-"
    if ident.startswith(prefix) and ident[len(prefix):].isdigit():
        return int(ident[len(prefix):])
    return None


# ---- the instance end (blocking) --------------------------------------------------------

class InstanceChannel:
    """An instance's socket: send ToController messages, drain ToInstance commands."""

    def __init__(self, endpoint: str, instance_id: int, context: zmq.Context | None = None,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        _require_ipc(endpoint)
        self.instance_id = instance_id
        self._own_context = context is None
        self._context = context or zmq.Context()
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, routing_id(instance_id))
        sock.setsockopt(zmq.LINGER, INSTANCE_LINGER_MS)
        sock.setsockopt(zmq.SNDHWM, 0)  # never block the engine loop on a slow controller
        sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
        sock.connect(endpoint)
        self._sock = sock
        self._encoder = Encoder()
        self._decoder = instance_decoder()

    @property
    def num_bad_frames(self) -> int:
        return self._decoder.num_bad_frames

    def send(self, message: ToController, frames=()) -> None:
        """`frames`: a Handoff's KV frames (buffers, sent without a copy)."""
        if frames:
            self._sock.send_multipart([self._encoder.encode(message), *frames], copy=False)
        else:
            self._sock.send(self._encoder.encode(message), copy=False)

    def drain(self, timeout: float = 0.0, limit: int = 4096,
              ) -> list[tuple[ToInstance, list | tuple]]:
        """Every command that is already queued (up to `limit`), waiting at most `timeout`
        seconds for the first one: (command, its KV frames) pairs, the frames empty but for
        a SubmitPrefilled's. Malformed frames are dropped (logged and counted)."""
        if not self._sock.poll(max(0, round(timeout * 1000)), zmq.POLLIN):
            return []
        received: list[tuple[ToInstance, list | tuple]] = []
        for _ in range(limit):
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            pair = self._decode(frames)
            if pair is not None:
                received.append(pair)
        return received

    def _decode(self, frames: list) -> tuple[ToInstance, list | tuple] | None:
        if len(frames) != 1 and len(frames) != 1 + _kv_frames_announced(frames[0].buffer,
                                                                          SubmitPrefilled):
            self._decoder.num_bad_frames += 1
            log.warning("dropped a %d-part message (commands are one frame; a prefilled "
                        "request's KV as many more as its header says)", len(frames))
            return None
        message = self._decoder.decode(frames[0].buffer)
        if message is None:
            return None
        return message, [f.buffer for f in frames[1:]] if len(frames) > 1 else NO_FRAMES

    def close(self) -> None:
        self._sock.close()
        if self._own_context:
            self._context.term()


# ---- the controller end (asyncio) -------------------------------------------------------

class ControllerChannel:
    """The controller's socket: receive from every instance, send to one by id.

    Bind it before starting instances and put `endpoint` in their InstanceConfig.
    """

    def __init__(self, runtime_dir: str | os.PathLike, context: zmq.asyncio.Context | None = None,
                 name: str = CONTROLLER_SOCKET,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.endpoint = ipc_endpoint(runtime_dir, name)
        self._own_context = context is None
        self._context = context or zmq.asyncio.Context()
        sock = self._context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, CONTROLLER_SNDHWM)
        sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
        sock.bind(self.endpoint)
        self._sock = sock
        self._encoder = Encoder()
        self._decoder = controller_decoder()

    @property
    def num_bad_frames(self) -> int:
        return self._decoder.num_bad_frames

    async def send(self, instance_id: int, message: ToInstance, frames=()) -> None:
        """Hand `message` to instance `instance_id` without waiting for it to be read;
        `frames`: a SubmitPrefilled's KV frames, passed on as received.

        Raises InstanceUnreachable when that instance is not connected (never started,
        died, not yet connected) or has CONTROLLER_SNDHWM messages it has not read."""
        await self.send_frame(instance_id, self._encoder.encode(message), *frames)

    async def send_frame(self, instance_id: int, frame: bytes, *more) -> None:
        """Send raw bytes as one command frame (tests use it to send garbage); `more`:
        frames that follow it in the same message."""
        try:
            await self._sock.send_multipart([routing_id(instance_id), frame, *more], zmq.NOBLOCK,
                                            copy=not more)
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:
                raise InstanceUnreachable(f"instance {instance_id} is not connected") from None
            if exc.errno == errno.EAGAIN:
                raise InstanceUnreachable(f"instance {instance_id} is not reading") from None
            raise

    async def recv(self) -> tuple[ToController, list | tuple]:
        """The next well-formed message from any instance and its KV frames (empty but for
        a Handoff's); bad frames are dropped (logged)."""
        while True:
            frames = await self._sock.recv_multipart(copy=False)
            pair = self._decode(frames)
            if pair is not None:
                return pair

    def __aiter__(self):
        return self

    async def __anext__(self) -> tuple[ToController, list | tuple]:
        return await self.recv()

    def _decode(self, frames: list) -> tuple[ToController, list | tuple] | None:
        ident = frames[0].bytes
        if len(frames) != 2 and (len(frames) < 2 or len(frames) != 2 + _kv_frames_announced(
                frames[1].buffer, Handoff)):
            self._decoder.num_bad_frames += 1
            log.warning("dropped a %d-part message from %r", len(frames), ident)
            return None
        message = self._decoder.decode(frames[1].buffer)
        if message is None:
            return None
        if _instance_id_of(ident) != message.instance_id:
            self._decoder.num_bad_frames += 1
            log.warning("dropped a %s from %r claiming instance %d",
                        type(message).__name__, ident, message.instance_id)
            return None
        return message, frames[2:] if len(frames) > 2 else NO_FRAMES

    def close(self) -> None:
        """Close the socket and remove its file (ZeroMQ leaves an ipc socket's file)."""
        self._sock.close(linger=0)
        if self._own_context:
            self._context.term()
        if self.endpoint.startswith("ipc://"):
            Path(self.endpoint.removeprefix("ipc://")).unlink(missing_ok=True)


_KV_HEADER = msgspec.msgpack.Decoder(Handoff | SubmitPrefilled)


def _kv_frames_announced(frame, kind: type) -> int:
    """How many KV frames follow `frame` in a multi-part message: its header's layer count
    when it is a `kind` with KV, else 0 (the message is then dropped as multi-part)."""
    try:
        message = _KV_HEADER.decode(frame)
    except msgspec.DecodeError:
        return 0
    return message.kv.num_layers if isinstance(message, kind) and message.kv else 0


def _require_ipc(endpoint: str) -> None:
    if not endpoint.startswith("ipc://"):
        raise ValueError(f"only ipc:// endpoints are allowed, got {endpoint!r}")


__all__ = [
    "ControllerChannel", "InstanceChannel", "InstanceUnreachable", "ipc_endpoint",
    "make_runtime_dir", "routing_id",
]
