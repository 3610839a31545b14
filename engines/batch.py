"""What one engine step runs: the scheduler's decision, handed to an executor.

A batch is a list of chunks. Each chunk is a run of consecutive tokens of one
request that are not yet in the KV cache: a prefill chunk (maybe the whole prompt,
maybe a piece whose earlier pieces are already cached) or a single decode token. A
step's running decodes -- most of its chunks -- are kept as columns, not one `Chunk`
each.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator

import msgspec

from engines.request import Request
from policies.batch_shape import BatchShape


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
    """The step's chunks: first its running decodes as columns (`decodes`, their requests,
    and `decode_starts`, where each token goes -- no `Chunk` struct each: a step makes one
    per running request), then the chunks `add` made (prompt pieces, and a recomputed
    decode now and then), in order. `chunks` lists them all as `Chunk`s."""

    __slots__ = ("decodes", "decode_starts", "added", "offloaded", "dropped", "admitted",
                 "num_tokens", "shape_cache", "_chunks")

    def __init__(self) -> None:
        self.decodes: list[Request] = []    # running decodes, one token each, in order
        self.decode_starts: list[int] = []  # ... each one's position (computed tokens)
        self.added: list[Chunk] = []        # the chunks `add` made, after the decodes
        self.admitted: list[Request] = []   # left the waiting queue to run (a prefix taken)
        self.offloaded: list[Request] = []  # left the waiting queue for an HP instance
        self.dropped: list[Request] = []    # given up on: their TTFT SLO is lost
        self.num_tokens = 0
        #: `shape()` of the chunks so far (None: not computed yet)
        self.shape_cache: BatchShape | None = None
        self._chunks: list[Chunk] | None = None  # `chunks`, made when first asked for

    def add(self, request: Request, num_tokens: int) -> None:
        start, n = request.num_computed_tokens, len(request.token_ids)
        samples = start + num_tokens == n
        self.add_chunk(Chunk(request, start, num_tokens, samples,
                             num_tokens == 1 and samples and n > request.num_prompt_tokens))

    def add_chunk(self, chunk: Chunk) -> None:
        """Run `chunk` (made by `add`, or taken from another batch) after the others."""
        self.added.append(chunk)
        self.num_tokens += chunk.num_tokens
        self.shape_cache = self._chunks = None

    def add_decodes(self, requests: list[Request]) -> None:
        """`add(request, 1)` for each of `requests`, every one decoding (`is_decoding`): the
        same chunks, their flags known, kept as columns. Before any `add`: the decodes of
        a step run first."""
        if self.added:
            raise RuntimeError("a batch's decodes are added before its other chunks")
        self.decodes += requests
        self.decode_starts += [r.num_computed_tokens for r in requests]
        self.num_tokens += len(requests)
        self.shape_cache = self._chunks = None

    @property
    def chunks(self) -> list[Chunk]:
        """Every chunk, in order, the decodes' made now (read-only: add through `add`)."""
        if self._chunks is None:
            self._chunks = [Chunk(r, start, 1, True, True)
                            for r, start in zip(self.decodes, self.decode_starts)] + self.added
        return self._chunks

    def runs(self) -> Iterator[tuple[Request, int, bool]]:
        """(request, tokens, samples) of each chunk, in order, the decodes' without a
        `Chunk`: what a step's results go through."""
        return itertools.chain(zip(self.decodes, itertools.repeat(1), itertools.repeat(True)),
                               ((c.request, c.num_tokens, c.samples) for c in self.added))

    def requests(self) -> list[Request]:
        """Each chunk's request, in order."""
        return self.decodes + [c.request for c in self.added]

    def sampling_requests(self) -> list[Request]:
        """The requests a token is sampled for, in chunk order."""
        return self.decodes + [c.request for c in self.added if c.samples]

    @property
    def num_sampling(self) -> int:
        return len(self.decodes) + sum(c.samples for c in self.added)

    @property
    def first_is_decode(self) -> bool:
        return bool(self.decodes) or (bool(self.added) and self.added[0].is_decode)

    def shape(self) -> BatchShape:
        """The batch as the performance model sees it. Decodes become their context length
        (the new token included); every other chunk, a one-token last piece of a prompt
        too, is a prefill chunk (tokens, already cached). Computed once per batch contents
        (kept until a chunk is added)."""
        if self.shape_cache is None:
            added = self.added
            decodes = [start + 1 for start in self.decode_starts]
            decodes += [c.start + 1 for c in added if c.is_decode]
            prefills = [(c.num_tokens, c.start) for c in added if not c.is_decode]
            self.shape_cache = BatchShape.of(prefills=prefills, decodes=decodes)
        return self.shape_cache

    @property
    def sampling_chunks(self) -> list[Chunk]:
        return [c for c in self.chunks if c.samples]

    def __len__(self) -> int:
        return len(self.decodes) + len(self.added)

    def __bool__(self) -> bool:
        return bool(self.decodes or self.added)

    @property
    def has_events(self) -> bool:
        """Anything happened this step: chunks to run, or requests that left the queue."""
        return bool(self.decodes or self.added or self.offloaded or self.dropped)
