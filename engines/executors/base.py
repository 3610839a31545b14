"""The executor interface: run one batch, return the sampled tokens."""
from __future__ import annotations

from typing import Protocol

from engines.batch import Batch


class Executor(Protocol):
    #: KV cache capacity in blocks of `block_size` tokens, fixed when the executor is built.
    num_kv_blocks: int
    block_size: int

    def execute(self, batch: Batch) -> list[int]:
        """Run every chunk of `batch` in one forward pass.

        Writes each chunk's keys/values into the request's KV blocks (`request.block_table`,
        already allocated by the scheduler) and returns one sampled token id per chunk whose
        `samples` is true, in the order of `batch.chunks`. A request whose
        `sampling.logprobs` is set gets that token's `ipc.messages.TokenLogprobs` in
        `request.sampled_logprobs` (the scheduler puts them in its TokenOutput).
        """
        ...
