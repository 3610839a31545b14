"""What one engine step runs: the scheduler's decision, handed to an executor.

A batch is a list of chunks. Each chunk is a run of consecutive tokens of one
request that are not yet in the KV cache: a prefill chunk (maybe the whole prompt,
maybe a piece whose earlier pieces are already cached) or a single decode token.
"""
from __future__ import annotations

from engines.request import Request


class Chunk:
    """`num_tokens` tokens of `request`, at positions start .. start+num_tokens-1."""

    __slots__ = ("request", "start", "num_tokens")

    def __init__(self, request: Request, start: int, num_tokens: int) -> None:
        self.request = request
        self.start = start
        self.num_tokens = num_tokens

    @property
    def token_ids(self) -> list[int]:
        return self.request.token_ids[self.start: self.start + self.num_tokens]

    @property
    def context_len(self) -> int:
        """Tokens in the KV cache once this chunk is written (what its last token attends to)."""
        return self.start + self.num_tokens

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the request's newest token, so a new token is sampled."""
        return self.start + self.num_tokens == len(self.request.token_ids)

    @property
    def is_decode(self) -> bool:
        return self.num_tokens == 1 and self.request.num_output_tokens > 0 and self.samples

    def __repr__(self) -> str:
        return f"Chunk({self.request.request_id!r}, start={self.start}, n={self.num_tokens})"


class Batch:
    __slots__ = ("chunks", "preempted", "offloaded", "dropped", "num_tokens")

    def __init__(self) -> None:
        self.chunks: list[Chunk] = []
        self.preempted: list[Request] = []  # sent back to waiting while building this batch
        self.offloaded: list[Request] = []  # left the waiting queue for an HP instance
        self.dropped: list[Request] = []    # given up on: their TTFT SLO is lost
        self.num_tokens = 0

    def add(self, request: Request, num_tokens: int) -> None:
        self.chunks.append(Chunk(request, request.num_computed_tokens, num_tokens))
        self.num_tokens += num_tokens

    @property
    def sampling_chunks(self) -> list[Chunk]:
        return [c for c in self.chunks if c.samples]

    def __len__(self) -> int:
        return len(self.chunks)

    def __bool__(self) -> bool:
        return bool(self.chunks)

    @property
    def has_events(self) -> bool:
        """Anything happened this step: chunks to run, or requests that left the queue."""
        return bool(self.chunks or self.offloaded or self.dropped)
