"""A serving process freezes its start-up heap: garbage is collected first (never frozen),
what is alive leaves the collector's generations (no collection visits it again).

Covers: engines/gc_freeze.py.
"""
from __future__ import annotations

import gc
import weakref

import pytest

from engines.gc_freeze import few_collections, freeze_startup_heap


class Node:
    """A reference cycle: only the cyclic collector reclaims it."""

    def __init__(self) -> None:
        self.me = self


def test_freezing_collects_the_garbage_and_freezes_what_lives():
    alive, dead = Node(), Node()
    dead_ref = weakref.ref(dead)
    del dead
    try:
        frozen = freeze_startup_heap()
        assert dead_ref() is None  # collected, not frozen for ever
        assert frozen == gc.get_freeze_count() > 0
        assert not any(obj is alive for obj in gc.get_objects())  # no generation holds it
        gc.collect()
        assert alive.me is alive
    finally:
        gc.unfreeze()
    assert any(obj is alive for obj in gc.get_objects())


@pytest.mark.slow
def test_a_simulated_run_collects_less_and_leaves_the_collector_as_it_found_it():
    """Within `few_collections` what was built before is frozen and the youngest
    generation waits for many more allocations; after, both are as before, and the
    garbage made within is collectable again."""
    before = gc.get_threshold()
    built = Node()
    with few_collections(threshold=12_345):
        assert gc.get_threshold()[0] == 12_345
        assert not any(obj is built for obj in gc.get_objects())  # frozen
        left_behind = Node()
        ref = weakref.ref(left_behind)
        del left_behind
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None
