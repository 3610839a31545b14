"""msgpack encoding of the wire messages, with strict typed decoding that never raises.

A receiver must survive any frame: `Decoder.decode` returns None (and logs why) for
garbage, an unknown message type, a missing or unknown field, or a field of the wrong
type (strict: no str -> int coercion). Nothing here ever unpickles anything.
"""
from __future__ import annotations

import logging
from typing import Generic, TypeVar

import msgspec

from ipc.messages import ToController, ToInstance

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How much of a bad frame a warning quotes.
_QUOTE_BYTES = 48


class Encoder:
    """Encodes any wire message to msgpack bytes."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()

    def encode(self, message: msgspec.Struct) -> bytes:
        return self._encoder.encode(message)


class Decoder(Generic[T]):
    """Decodes frames into one message union; counts and logs the frames it drops."""

    def __init__(self, union: type[T], name: str = "") -> None:
        self._decoder = msgspec.msgpack.Decoder(union)
        self.name = name or getattr(union, "__name__", str(union))
        self.num_bad_frames = 0

    def decode(self, frame: bytes | bytearray | memoryview) -> T | None:
        try:
            return self._decoder.decode(frame)
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError too
            self.num_bad_frames += 1
            quoted = bytes(frame[:_QUOTE_BYTES])
            log.warning("dropped a malformed %s frame (%d bytes, %r...): %s",
                        self.name, len(frame), quoted, exc)
            return None


def instance_decoder() -> Decoder[ToInstance]:
    """What an instance reads: controller -> instance messages."""
    return Decoder(ToInstance, "controller->instance")


def controller_decoder() -> Decoder[ToController]:
    """What the controller reads: instance -> controller messages."""
    return Decoder(ToController, "instance->controller")
