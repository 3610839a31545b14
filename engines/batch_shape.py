"""An engine batch as the performance model sees it (policies.batch_shape.BatchShape)."""
from __future__ import annotations

from engines.batch import Batch
from policies.batch_shape import BatchShape


def batch_shape(batch: Batch) -> BatchShape:
    """Decodes become their context length (the new token included); every other chunk,
    a one-token last piece of a prompt too, is a prefill chunk (tokens, already cached).
    Computed once per batch contents (the batch keeps it until a chunk is added)."""
    if batch.shape_cache is None:
        chunks = batch.chunks
        decodes = [c.start + 1 for c in chunks if c.is_decode]
        prefills = [(c.num_tokens, c.start) for c in chunks if not c.is_decode]
        batch.shape_cache = BatchShape.of(prefills=prefills, decodes=decodes)
    return batch.shape_cache
