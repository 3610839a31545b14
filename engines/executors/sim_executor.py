"""The sim executor: no model. Each batch costs what a latency function says; every
request ends exactly at its max_tokens (or the context limit), never earlier.

The daemon uses it to run without a GPU (overhead benchmarks, tests); a simulator can
pass a `sleep` that advances a virtual clock instead of waiting.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from engines.batch import Batch
from engines.executors.latency import LatencyFn


class SimExecutor:
    def __init__(self, latency_fn: LatencyFn, num_kv_blocks: int = 4096, block_size: int = 16,
                 max_model_len: int = 4096, sleep: Callable[[float], object] = time.sleep,
                 token_id: int = 0) -> None:
        self.latency_fn = latency_fn
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.sleep = sleep
        self.token_id = token_id
        #: No EOS: only max_tokens (or max_model_len) ends a request.
        self.eos_token_ids: frozenset[int] = frozenset()
        self.busy_time = 0.0  # total latency charged so far, seconds

    def execute(self, batch: Batch) -> list[int]:
        seconds = self.latency(batch)
        if seconds > 0.0:
            self.sleep(seconds)
        return self.tokens(batch)

    def latency(self, batch: Batch) -> float:
        """What `batch` costs (charged to `busy_time`); a simulator schedules its end."""
        seconds = self.latency_fn(batch)
        self.busy_time += max(seconds, 0.0)
        return seconds

    def tokens(self, batch: Batch) -> list[int]:
        """The sampled tokens of `batch`, without running anything."""
        return [self._token_for(c.request.sampling.stop_token_ids) for c in batch.sampling_chunks]

    def _token_for(self, stop_token_ids: list[int]) -> int:
        """The fixed token, or the next id that is not one of this request's stop tokens."""
        token = self.token_id
        while stop_token_ids and token in stop_token_ids:
            token += 1
        return token
