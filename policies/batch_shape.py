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
    """Immutable. prefill_tokens[i] = c_i, prefill_cached[i] = l_i, decode_context[j] = l̂_j.

    Held as Python ints: `prefills`, the (c, l) pairs, and `decodes`, the contexts, with
    `num_tokens` (the chunk sizes plus one per decode) and `decode_context_sum` summed
    once. The performance models read those in plain floats once per step, where making
    and summing numpy arrays of a hundred decodes would cost more than the models
    themselves; the read-only int64 arrays are made on first use (the sums are exact:
    integer sums do not depend on their order)."""

    __slots__ = ("prefills", "decodes", "num_tokens", "decode_context_sum", "_arrays")

    def __init__(self, prefill_tokens=(), prefill_cached=(), decode_context=()) -> None:
        c, l = _frozen(prefill_tokens), _frozen(prefill_cached)
        if c.shape != l.shape or c.ndim != 1:
            raise ValueError("prefill_tokens and prefill_cached must be 1-d and the same length")
        if c.size and c.min() < 1:
            raise ValueError("a prefill chunk computes at least one token")
        ctx = _frozen(decode_context).reshape(-1)
        if ctx.size and ctx.min() < 1:
            raise ValueError("a decode attends to at least its own token")
        tokens, contexts = c.tolist(), tuple(ctx.tolist())
        self._fill(tuple(zip(tokens, l.tolist())), contexts, sum(tokens), sum(contexts))
        object.__setattr__(self, "_arrays", (c, l, ctx))

    def _fill(self, prefills: tuple, decodes: tuple, token_sum: int, context_sum: int) -> None:
        """Set the fields from valid sizes in Python ints (`token_sum`: the chunks' c)."""
        set_field = object.__setattr__
        set_field(self, "prefills", prefills)
        set_field(self, "decodes", decodes)
        set_field(self, "num_tokens", token_sum + len(decodes))
        set_field(self, "decode_context_sum", context_sum)
        set_field(self, "_arrays", None)

    def __setattr__(self, name, value):
        raise AttributeError("BatchShape is immutable")

    @classmethod
    def of(cls, prefills: Iterable[tuple[int, int]] = (),
           decodes: Iterable[int] = ()) -> "BatchShape":
        """From (c, l) pairs and decode context lengths."""
        pairs, contexts = list(prefills), tuple(decodes)
        try:  # the commonest case, valid pairs of Python ints (else a sum is not an int)
            tokens, cached = [c for c, _ in pairs], [l for _, l in pairs]
            token_sum, context_sum = sum(tokens), sum(contexts)
            valid = (type(token_sum) is type(sum(cached)) is type(context_sum) is int
                     and (not pairs or (min(tokens) >= 1 and min(cached) >= 0))
                     and (not contexts or min(contexts) >= 1))
        except (TypeError, ValueError):
            valid = False
        if not valid:  # numpy converts the rest, or raises what `__init__` raises
            pairs = _frozen(pairs, columns=2)
            return cls(pairs[:, 0], pairs[:, 1], contexts)
        shape = object.__new__(cls)
        shape._fill(tuple(zip(tokens, cached)), contexts, token_sum, context_sum)
        return shape

    @classmethod
    def prefill_only(cls, num_tokens: int, already: int = 0) -> "BatchShape":
        """One prefill chunk of `num_tokens` after `already` cached tokens, nothing else."""
        return cls.of(((num_tokens, already),))

    def _as_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(c, l, l̂) as read-only int64 arrays, made on first use."""
        if self._arrays is None:
            columns = ([c for c, _ in self.prefills], [l for _, l in self.prefills],
                       self.decodes)
            object.__setattr__(self, "_arrays", tuple(map(_frozen, columns)))
        return self._arrays

    @property
    def prefill_tokens(self) -> np.ndarray:
        return self._as_arrays()[0]

    @property
    def prefill_cached(self) -> np.ndarray:
        return self._as_arrays()[1]

    @property
    def decode_context(self) -> np.ndarray:
        return self._as_arrays()[2]

    @property
    def num_prefills(self) -> int:
        return len(self.prefills)

    @property
    def num_decodes(self) -> int:
        return len(self.decodes)

    @property
    def num_seqs(self) -> int:
        return len(self.prefills) + len(self.decodes)

    def _key(self) -> tuple:
        return self.prefills, self.decodes

    def __eq__(self, other) -> bool:
        return isinstance(other, BatchShape) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"BatchShape(prefills={list(self.prefills)}, decodes={list(self.decodes)})"
