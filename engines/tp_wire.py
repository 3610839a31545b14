"""What rank 0 of a tensor-parallel instance sends its other ranks: one command per
message, msgspec MessagePack over a ZeroMQ PUSH socket (never pickle).

`Step` is a step's sequences in batch order (each rank lays them out and runs the same
forward pass); `ExportKv` / `ImportKv` move a P/D hand-off's KV through the ranks (each
exports or imports its own heads); `Stop` ends a rank cleanly.
"""
from __future__ import annotations

import msgspec

from ipc.messages import KvLayout


class StepSeq(msgspec.Struct, array_like=True, gc=False):
    """One chunk of a step as every rank needs it: new tokens at positions
    start .. start+len(token_ids)-1, written into `block_table`'s blocks; `samples`:
    rank 0 samples a token after it."""

    start: int
    token_ids: list[int]
    block_table: list[int]
    samples: bool

    @classmethod
    def of(cls, chunk) -> "StepSeq":
        """The sequence of an engines.batch.Chunk."""
        return cls(chunk.start, chunk.token_ids, chunk.request.block_table, chunk.samples)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        return self.start + len(self.token_ids)

    def __repr__(self) -> str:
        return f"StepSeq(start={self.start}, n={self.num_tokens})"


class Step(msgspec.Struct, tag="step", array_like=True):
    seqs: list[StepSeq]


class ExportKv(msgspec.Struct, tag="export", array_like=True):
    """Each rank exports the first `num_tokens` tokens' KV of its heads and sends it to
    rank 0 (torch.distributed gather)."""

    block_table: list[int]
    num_tokens: int


class ImportKv(msgspec.Struct, tag="import", array_like=True):
    """Every KV head of a hand-off (`layout`, one frame per layer); each rank writes its
    own heads into `block_table`."""

    block_table: list[int]
    layout: KvLayout
    frames: list[bytes]


class Stop(msgspec.Struct, tag="stop", array_like=True):
    pass


Command = Step | ExportKv | ImportKv | Stop

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Command)


def encode(command: Command) -> bytes:
    return _encoder.encode(command)


def decode(data: bytes) -> Command:
    return _decoder.decode(data)
