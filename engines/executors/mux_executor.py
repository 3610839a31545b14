"""A multiplexed instance's executor: each model's executor, run in turn.

A `MuxBatch` (engines/mux_core.py) holds each model's part of a step; the parts run one
after the other on their own executors (temporal multiplexing: a step lasts the sum of
its parts), and the sampled tokens come back in the parts' order, as the core reads
them. Sim executors: a step's latency is the sum of the parts' predicted latencies (each
model's profile), its tokens the parts' tokens. Overlapping the parts on CUDA streams
(MuxServe's spatial sharing) is not done here.
"""
from __future__ import annotations

from engines.executors.base import Executor


class MuxExecutor:
    def __init__(self, executors: dict[str, Executor]) -> None:
        self.executors = executors
        first = next(iter(executors.values()))
        self.device = first.device  # what a driver waits for when timing a step
        self.carries_kv = False     # no P/D hand-offs on a multiplexed instance

    def execute(self, batch) -> list[int]:
        sampled: list[int] = []
        for name, part in batch.parts:
            if part:
                sampled += self.executors[name].execute(part)
        return sampled

    def latency(self, batch) -> float:
        """Sim executors: the parts' predicted seconds, one after the other."""
        return sum(self.executors[name].latency(part) for name, part in batch.parts if part)

    def tokens(self, batch) -> list[int]:
        """Sim executors: the parts' sampled tokens, without running anything."""
        return [t for name, part in batch.parts if part
                for t in self.executors[name].tokens(part)]
