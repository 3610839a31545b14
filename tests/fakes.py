"""A model-free executor for scheduler tests: checks what the scheduler hands it; and an
instance core over it, stepped by hand."""
from __future__ import annotations

import zlib

from engines.batch import Batch
from engines.executors.base import Executor
from engines.instance_core import InstanceCore, Output
from engines.scheduler_config import SchedulerConfig
from ipc.messages import Role


def next_token(tokens: list[int], vocab: int = 50) -> int:
    """A deterministic 'model': the next token is a hash of the whole context."""
    return 2 + zlib.crc32(bytes(str(tokens), "ascii")) % vocab


class FakeExecutor:
    """Keeps what each KV block holds (a token per slot) and checks every chunk against it:
    the context a chunk attends to, read back through its block table, must be its
    request's tokens -- whether its own earlier chunks or a shared cached prefix wrote them."""

    def __init__(self, num_kv_blocks: int = 64, block_size: int = 4, max_model_len: int = 256,
                 eos_token_ids: frozenset[int] = frozenset()) -> None:
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.vocab_size = None
        self.device = None
        self.carries_kv = False
        self.slots: dict[tuple[int, int], int] = {}   # (block, slot) -> token written there
        #: KV that arrived from elsewhere for a request (a P/D hand-off), by request id:
        #: written into its blocks before its next chunk runs.
        self.cache: dict[str, list[int]] = {}
        self.batches: list[Batch] = []

    def export_kv(self, block_table: list[int], num_tokens: int) -> tuple[None, list]:
        return None, []

    def import_kv(self, block_table: list[int], layout, frames: list) -> None:
        """A hand-off's tokens come through `cache` instead (see execute)."""

    def _read(self, table: list[int], length: int) -> list:
        bs = self.block_size
        return [self.slots.get((table[p // bs], p % bs)) for p in range(length)]

    def execute(self, batch: Batch) -> list[int]:
        self.batches.append(batch)
        writers: dict[int, str] = {}
        sampled = []
        bs = self.block_size
        for chunk in batch.chunks:
            request, table = chunk.request, chunk.request.block_table
            assert len(table) * bs >= chunk.context_len, "blocks short"
            for p, token in enumerate(self.cache.pop(request.request_id, [])):
                self.slots[table[p // bs], p % bs] = token
            cached = self._read(table, chunk.start)
            assert cached == request.token_ids[:chunk.start], f"{chunk}: wrong cached context"
            for p, token in enumerate(chunk.token_ids, start=chunk.start):
                block = table[p // bs]
                assert writers.setdefault(block, request.request_id) == request.request_id, \
                    "two requests write one block"
                self.slots[block, p % bs] = token
            if chunk.samples:
                sampled.append(next_token(self._read(table, chunk.context_len)))
        return sampled


def expected_output(prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(prompt):]


class FakeInstance:
    """A test's stand-in for an instance process: an instance core over an executor (a
    FakeExecutor unless given one), its turn taken with a fixed step time, not a clock."""

    def __init__(self, instance_id: int, role: Role, config: SchedulerConfig,
                 executor: Executor | None = None) -> None:
        self.executor = executor if executor is not None else FakeExecutor()
        self.core = InstanceCore(instance_id, role, self.executor, config)

    def step(self, now: float = 1.0, seconds: float = 0.01) -> list[Output]:
        """One turn's step: the core's batch run on the executor; the core's outputs."""
        batch, outputs = self.core.begin_step(now)
        if not batch:
            return outputs
        return self.core.finish_step(batch, self.executor.execute(batch), seconds, now)
