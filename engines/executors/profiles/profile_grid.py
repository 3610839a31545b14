"""The steps `ascendra profile` times: what the scheduler builds, on a grid.

Prefill chunks of several sizes after several cached contexts; decode batches of several
sizes at several contexts; "spread" decode batches whose contexts differ, evenly from a
low to a high one (traffic's batches: requests at every stage of their answers; a
backend may pay for the difference, engines/executors/profiles/measured.py `padding`);
and mixed steps (a prefill chunk beside a batch of decodes), up to the step's token
budget, the sequence limit and the context limit. Log-spaced, so both the small steps
(per-step costs dominate) and the full ones are seen; `quick` takes fewer points on each
axis. The same list for the same arguments.
"""
from __future__ import annotations

from policies.batch_shape import BatchShape
from engines.perf.calibration_shapes import _spread, kv_tokens


def profile_grid(token_budget: int, max_context: int, max_batch: int,
                 max_kv_tokens: int, quick: bool = False) -> list[tuple[str, BatchShape]]:
    """(kind, shape) pairs: "prefill", "decode", "spread", "mixed"; each fits
    `max_kv_tokens`."""
    points = 3 if quick else 6
    budget = max(1, min(token_budget, max_context))
    grid: list[tuple[str, BatchShape]] = []
    for chunk in _spread(16, budget, points):
        for cached in sorted({0, *_spread(chunk, max_context - chunk, points // 2)}):
            if chunk + cached <= max_context:
                grid.append(("prefill", BatchShape.prefill_only(chunk, cached)))
    for batch in _spread(1, max_batch, points):
        for context in _spread(16, max_context, points // 2 + 1):
            grid.append(("decode", BatchShape.of(decodes=[context] * batch)))
    for batch in _spread(2, max_batch, points // 2 + 1) if max_batch > 1 else ():
        for top in _spread(32, max_context, points // 2 + 1):
            for low in sorted({min(16, top), max(1, top // 2)}):
                if low < top:
                    grid.append(("spread", BatchShape.of(decodes=evenly(low, top, batch))))
    for batch in _spread(1, min(max_batch, budget - 1), points // 2 + 1) if budget > 1 else ():
        for chunk in _spread(16, budget - batch, points // 2 + 1):
            cached = max_context // 4 if chunk + max_context // 4 <= max_context else 0
            grid.append(("mixed", BatchShape.of(prefills=[(chunk, cached)],
                                                decodes=[max(1, max_context // 4)] * batch)))
    seen, kept = set(), []
    for kind, shape in grid:
        if kv_tokens(shape) <= max_kv_tokens and shape not in seen:
            seen.add(shape)
            kept.append((kind, shape))
    return kept


def evenly(low: int, high: int, count: int) -> list[int]:
    """`count` contexts evenly from `high` down to `low` (count >= 2)."""
    return [round(high - (high - low) * i / (count - 1)) for i in range(count)]
