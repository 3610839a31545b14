"""What one engine step runs: the scheduler's decision, handed to an executor.

A batch is a list of chunks. Each chunk is a run of consecutive tokens of one
request that are not yet in the KV cache: a prefill chunk (maybe the whole prompt,
maybe a piece whose earlier pieces are already cached) or a single decode token.
"""
from __future__ import annotations

import msgspec

from engines.request import Request
from policies.perf.batch_shape import BatchShape


class Chunk(msgspec.Struct, eq=False, gc=False):
    """`num_tokens` tokens of `request`, at positions start .. start+num_tokens-1.

    `samples` and `is_decode` are fixed when the chunk is made (the step's view of the
    request; `Batch.add` works them out): a step samples a new token for a chunk that
    reaches the request's newest token; a decode is such a one-token chunk after the
    first output token. A struct (made in C, one per decode of every step), compared
    by identity as a plain object is; `gc=False`: it refers to its request only."""

    request: Request
    start: int
    num_tokens: int
    samples: bool
    is_decode: bool

    @property
    def token_ids(self) -> list[int]:
        return self.request.token_ids[self.start: self.start + self.num_tokens]

    @property
    def context_len(self) -> int:
        """Tokens in the KV cache once this chunk is written (what its last token attends to)."""
        return self.start + self.num_tokens

    def __repr__(self) -> str:
        return f"Chunk({self.request.request_id!r}, start={self.start}, n={self.num_tokens})"


class Batch:
    __slots__ = ("chunks", "offloaded", "dropped", "admitted", "num_tokens", "shape_cache")

    def __init__(self) -> None:
        self.chunks: list[Chunk] = []
        self.admitted: list[Request] = []   # left the waiting queue to run (a prefix taken)
        self.offloaded: list[Request] = []  # left the waiting queue for an HP instance
        self.dropped: list[Request] = []    # given up on: their TTFT SLO is lost
        self.num_tokens = 0
        #: `shape()` of the chunks so far (None: not computed yet)
        self.shape_cache: BatchShape | None = None

    def add(self, request: Request, num_tokens: int) -> None:
        start, n = request.num_computed_tokens, len(request.token_ids)
        samples = start + num_tokens == n
        self.chunks.append(Chunk(request, start, num_tokens, samples,
                                 num_tokens == 1 and samples and n > request.num_prompt_tokens))
        self.num_tokens += num_tokens
        self.shape_cache = None

    def add_decodes(self, requests: list[Request]) -> None:
        """`add(request, 1)` for each of `requests`, every one decoding (`is_decoding`): the
        same chunks, their flags known here. A step makes one per running decode."""
        self.chunks += [Chunk(r, r.num_computed_tokens, 1, True, True) for r in requests]
        self.num_tokens += len(requests)
        self.shape_cache = None

    def shape(self) -> BatchShape:
        """The batch as the performance model sees it. Decodes become their context length
        (the new token included); every other chunk, a one-token last piece of a prompt
        too, is a prefill chunk (tokens, already cached). Computed once per batch contents
        (kept until a chunk is added)."""
        if self.shape_cache is None:
            chunks = self.chunks
            decodes = [c.start + 1 for c in chunks if c.is_decode]
            prefills = [(c.num_tokens, c.start) for c in chunks if not c.is_decode]
            self.shape_cache = BatchShape.of(prefills=prefills, decodes=decodes)
        return self.shape_cache

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
