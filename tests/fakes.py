"""A model-free executor for scheduler tests: checks what the scheduler hands it."""
from __future__ import annotations

import zlib

from engines.batch import Batch


def next_token(tokens: list[int], vocab: int = 50) -> int:
    """A deterministic 'model': the next token is a hash of the whole context."""
    return 2 + zlib.crc32(bytes(str(tokens), "ascii")) % vocab


class FakeExecutor:
    """Keeps its own copy of each request's cached tokens and checks every chunk against it."""

    def __init__(self, num_kv_blocks: int = 64, block_size: int = 4, max_model_len: int = 256,
                 eos_token_ids: frozenset[int] = frozenset()) -> None:
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.cache: dict[str, list[int]] = {}
        self.batches: list[Batch] = []

    def execute(self, batch: Batch) -> list[int]:
        self.batches.append(batch)
        owners: dict[int, str] = {}
        sampled = []
        for chunk in batch.chunks:
            request = chunk.request
            cached = [] if chunk.start == 0 else self.cache[request.request_id]
            assert len(cached) == chunk.start, f"{chunk} but {len(cached)} tokens cached"
            assert len(request.block_table) * self.block_size >= chunk.context_len, "blocks short"
            for block in request.block_table:
                assert owners.setdefault(block, request.request_id) == request.request_id, "shared block"
            cached = cached + chunk.token_ids
            self.cache[request.request_id] = cached
            if chunk.samples:
                sampled.append(next_token(cached))
        return sampled


def expected_output(prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(prompt):]
