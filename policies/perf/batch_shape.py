"""What a batch holds, as far as its run time is concerned: the sizes, not the requests.

A batch is prefill chunks and decodes. A prefill chunk computes `c` new tokens of a
request that already has `l` tokens in the KV cache (the paper's c_i and l_i). A decode
computes one token that attends to `ctx` tokens, itself included (the paper's l̂_i).
The performance model reads nothing else, so the engines convert their batches into
this and the schedulers build hypothetical ones ("this batch plus that request").
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def _frozen(values, columns: int | None = None) -> np.ndarray:
    arr = np.array(values, dtype=np.int64)
    if columns is not None:
        arr = arr.reshape(-1, columns)
    if arr.size and arr.min() < 0:
        raise ValueError(f"batch sizes must be >= 0, got {values!r}")
    arr.flags.writeable = False
    return arr


class BatchShape:
    """Immutable. prefill_tokens[i] = c_i, prefill_cached[i] = l_i, decode_context[j] = l̂_j."""

    __slots__ = ("prefill_tokens", "prefill_cached", "decode_context")

    def __init__(self, prefill_tokens=(), prefill_cached=(), decode_context=()) -> None:
        c, l = _frozen(prefill_tokens), _frozen(prefill_cached)
        if c.shape != l.shape or c.ndim != 1:
            raise ValueError("prefill_tokens and prefill_cached must be 1-d and the same length")
        if c.size and c.min() < 1:
            raise ValueError("a prefill chunk computes at least one token")
        ctx = _frozen(decode_context).reshape(-1)
        if ctx.size and ctx.min() < 1:
            raise ValueError("a decode attends to at least its own token")
        object.__setattr__(self, "prefill_tokens", c)
        object.__setattr__(self, "prefill_cached", l)
        object.__setattr__(self, "decode_context", ctx)

    def __setattr__(self, name, value):
        raise AttributeError("BatchShape is immutable")

    @classmethod
    def of(cls, prefills: Iterable[tuple[int, int]] = (),
           decodes: Iterable[int] = ()) -> "BatchShape":
        """From (c, l) pairs and decode context lengths."""
        pairs, contexts = list(prefills), list(decodes)
        try:  # the commonest case, valid pairs of ints: checked in Python, one array each
            tokens, cached = [c for c, _ in pairs], [l for _, l in pairs]
            valid = ((not pairs or (min(tokens) >= 1 and min(cached) >= 0))
                     and (not contexts or min(contexts) >= 1))
        except (TypeError, ValueError):
            valid = False
        if not valid:  # raises what the checks of `__init__` raise
            pairs = _frozen(pairs, columns=2)
            return cls(pairs[:, 0], pairs[:, 1], contexts)
        shape = object.__new__(cls)
        for name, values in (("prefill_tokens", tokens), ("prefill_cached", cached),
                             ("decode_context", contexts)):
            arr = np.array(values, dtype=np.int64)
            arr.flags.writeable = False
            object.__setattr__(shape, name, arr)
        return shape

    @classmethod
    def prefill_only(cls, num_tokens: int, already: int = 0) -> "BatchShape":
        """One prefill chunk of `num_tokens` after `already` cached tokens, nothing else."""
        return cls((num_tokens,), (already,), ())

    @property
    def num_prefills(self) -> int:
        return int(self.prefill_tokens.size)

    @property
    def num_decodes(self) -> int:
        return int(self.decode_context.size)

    @property
    def num_seqs(self) -> int:
        return self.num_prefills + self.num_decodes

    @property
    def num_tokens(self) -> int:
        """Tokens computed by the batch: the chunk sizes plus one per decode."""
        return int(self.prefill_tokens.sum()) + self.num_decodes

    def _key(self) -> tuple:
        return (tuple(self.prefill_tokens.tolist()), tuple(self.prefill_cached.tolist()),
                tuple(self.decode_context.tolist()))

    def __eq__(self, other) -> bool:
        return isinstance(other, BatchShape) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        pairs = list(zip(self.prefill_tokens.tolist(), self.prefill_cached.tolist()))
        return f"BatchShape(prefills={pairs}, decodes={self.decode_context.tolist()})"
