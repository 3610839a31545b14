"""A short, fixed set of synthetic batches that an instance runs at start to fit its
performance model before real traffic arrives: prefill-only batches of several sizes and
cached contexts, decode-only batches of several sizes and contexts, and mixed batches
(decodes plus a prefill chunk that fills the token budget, or a small last chunk), so
both the memory-bound and the compute-bound ends of the roofline are seen.
"""
from __future__ import annotations

import numpy as np

from policies.batch_shape import BatchShape


def _spread(low: int, high: int, count: int) -> list[int]:
    """Up to `count` distinct integers from low to high, evenly spaced on a log scale."""
    low, high = max(1, low), max(1, high)
    if high <= low:
        return [high]
    return sorted({int(round(x)) for x in np.geomspace(low, high, count)})


def kv_tokens(shape: BatchShape) -> int:
    """Tokens the batch needs in the KV cache once it has run."""
    return int(shape.prefill_tokens.sum() + shape.prefill_cached.sum()
               + shape.decode_context.sum())


def _decodes(count: int, longest: int) -> list[int]:
    """`count` context lengths evenly spread from `longest` down to 1: real batches mix
    requests of every age (and padded attention kernels pay for the longest)."""
    return np.linspace(longest, 1, count).astype(int).tolist()


def calibration_shapes(token_budget: int, max_context: int, max_batch: int,
                       max_kv_tokens: int | None = None) -> list[BatchShape]:
    """About 30 shapes, the same every time for the same arguments. No sequence exceeds
    `max_context`; `max_kv_tokens` (the KV cache's capacity) shortens decode contexts so
    each batch fits, and drops other shapes that would not."""
    budget = max(1, min(token_budget, max_context))
    cap = max_kv_tokens or float("inf")
    shapes = [BatchShape.prefill_only(c) for c in _spread(16, budget, 6)]
    if max_context >= 2 * budget:
        shapes += [BatchShape.prefill_only(budget, l)
                   for l in _spread(budget, max_context - budget, 3)]
    quarter = max(1, budget // 4)
    shapes.append(BatchShape.of(prefills=[(quarter, i * budget) for i in range(4)]))
    for batch in _spread(1, max_batch, 4):
        for context in _spread(64, max_context, 3):
            longest = int(min(context, cap // batch))
            if longest >= 1:
                shapes.append(BatchShape.of(decodes=_decodes(batch, longest)))
    for batch in _spread(1, min(max_batch, budget - 1), 3) if budget > 1 else ():
        decodes = _decodes(batch, max_context // 2 or 1)
        for chunk in sorted({budget - batch, max(1, (budget - batch) // 8)}):
            shapes.append(BatchShape.of(prefills=[(chunk, max_context // 4)], decodes=decodes))
    return [s for s in shapes if kv_tokens(s) <= cap and _longest(s) <= max_context]


def _longest(shape: BatchShape) -> int:
    contexts = np.concatenate([shape.prefill_tokens + shape.prefill_cached,
                               shape.decode_context])
    return int(contexts.max(initial=0))


def random_shapes(count: int, token_budget: int, max_context: int, max_batch: int,
                  max_kv_tokens: int | None = None, seed: int = 0) -> list[BatchShape]:
    """`count` batches like a Sarathi-style engine makes while serving (some decodes, and
    mostly a prefill chunk that fills part of what the decodes leave of the token budget),
    for checking a fit on batches it was not calibrated on. Seeded: same arguments, same
    list. Every sequence gets at most an equal share of `max_kv_tokens`, so each batch fits."""
    if min(max_context, max_kv_tokens or max_context) < 2:
        raise ValueError("random_shapes needs room for at least 2 tokens of context")
    rng = np.random.default_rng(seed)
    budget = max(2, min(token_budget, max_context))
    shapes: list[BatchShape] = []
    while len(shapes) < count:
        num_decodes = int(rng.integers(0, min(max_batch, budget - 1) + 1))
        longest = int(min(max_context, (max_kv_tokens or max_context) // (num_decodes + 1)))
        if longest < 2:
            continue
        decodes = rng.integers(1, longest + 1, size=num_decodes).tolist()
        prefills = []
        if rng.random() < 0.6 or not decodes:
            chunk = int(rng.integers(1, min(budget - num_decodes, longest) + 1))
            prefills.append((chunk, int(rng.integers(0, longest - chunk + 1))))
        shapes.append(BatchShape.of(prefills=prefills, decodes=decodes))
    return shapes
