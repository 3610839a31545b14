"""Keep Python's cyclic garbage collector off what a process builds before it serves.

An instance process imports torch and builds its model, executor and performance model
before its loop starts: about 290,000 objects that live as long as the process (the
controller: about 50,000, from aiohttp, msgspec and the tokenizer). A collection of the
oldest generation visits every one of them: 120–140 ms in an instance, in the middle
of its serving loop (`python -m bench.micro.gc_pause`), where a step's whole scheduling
budget is half a millisecond. Frozen, they are never visited again; what is allocated
while serving is collected as before. vLLM freezes its start-up heap the same way
(`freeze_gc_heap` in vllm/utils/gc_utils.py).
"""
from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect what is garbage now, then freeze every object still alive (garbage frozen
    would never be reclaimed). Returns how many objects are frozen. Call once, after
    start-up and before serving."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
