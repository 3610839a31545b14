"""Keep Python's cyclic garbage collector off what a process builds before it serves.

An instance process imports torch and builds its model, executor and performance model
before its loop starts: about 290,000 objects that live as long as the process (the
controller: about 50,000, from aiohttp, msgspec and the tokenizer). A collection of the
oldest generation visits every one of them: 120–140 ms in an instance, in the middle
of its serving loop (`python -m bench.micro.gc_pause`), where a step's whole scheduling
budget is half a millisecond. Frozen, they are never visited again; what is allocated
while serving is collected as before. vLLM freezes its start-up heap the same way
(`freeze_gc_heap` in vllm/utils/gc_utils.py).

A simulated run (bench/sim/box_run.py) does the same for its stretch of work, and also
collects its young garbage less often (`few_collections`).
"""
from __future__ import annotations

import contextlib
import gc

#: Allocations between two collections of the youngest generation in a simulated run
#: (`few_collections`; Python's default is 700).
SIMULATION_GC_THRESHOLD = 50_000


def freeze_startup_heap() -> int:
    """Collect what is garbage now, then freeze every object still alive (garbage frozen
    would never be reclaimed). Returns how many objects are frozen. Call once, after
    start-up and before serving."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@contextlib.contextmanager
def few_collections(threshold: int = SIMULATION_GC_THRESHOLD):
    """Within: the heap built so far frozen, and the youngest generation collected once
    every `threshold` allocations instead of 700. For a process that allocates millions
    of short-lived objects in one stretch (a simulated run: a tuple or list per token),
    where collections of a young generation find little garbage and older ones revisit
    what was built before it. Restored after (unfrozen: what the stretch leaves behind
    may be collected again)."""
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(threshold, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
