"""Fairness-aware shedding (policies/class_floor.py, policies/global_queue.py): a class
under its floor is not the one set aside or dropped while another could be.

Covers: policies/class_floor.py, policies/global_queue.py.
"""
from __future__ import annotations

import dataclasses

from policies.class_floor import MIN_OUTCOMES, PromptClasses, quartile_bounds
from policies.global_queue import Lane, Shed, Waiting, plan


def w(key: str, deadline: float, cost: float, klass: int) -> Waiting:
    return Waiting(key, 0.0, deadline, cost, cost, klass=klass)


#: One long prompt (class 3) and three short ones (class 0) on one idle LP: all four
#: cannot meet their deadlines.
QUEUE = [w("short-a", 1.0, 0.3, 0), w("short-b", 1.1, 0.3, 0), w("long", 1.2, 0.8, 3),
         w("short-c", 1.3, 0.3, 0)]


def test_without_a_floor_the_long_prompt_is_the_one_dropped():
    out = plan(QUEUE, [Lane(0, 0.0)], [], now=0.0, bound=1e9, shed=Shed.DROP)
    assert [x.key for x in out.shed] == ["long"]
    assert sorted(x.key for x, _ in out.to_lp) == ["short-a", "short-b", "short-c"]


def test_a_protected_class_keeps_its_request_and_another_class_gives_way():
    out = plan(QUEUE, [Lane(0, 0.0)], [], now=0.0, bound=1e9, shed=Shed.DROP,
               protected=frozenset({3}))
    assert "long" in [x.key for x, _ in out.to_lp]
    assert out.shed and all(x.klass == 0 for x in out.shed)


def test_when_every_request_is_protected_the_costliest_still_gives_way():
    """No other class can give way: the triage is the paper's (demoting a late request
    instead of dropping it was tried: it only delays everyone, docs/fairness.md)."""
    queue = [dataclasses.replace(x, klass=3) for x in QUEUE]
    out = plan(queue, [Lane(0, 0.0)], [], now=0.0, bound=1e9, shed=Shed.DROP,
               protected=frozenset({3}))
    assert [x.key for x in out.shed] == ["long"]


#: Three LPs, two of them 0.9 s behind: the pool's mean backlog is 0.6 s.
UNEVEN = [Lane(0, 0.0), Lane(1, 0.9), Lane(2, 0.9)]


def test_a_protected_class_is_planned_on_the_lp_that_frees_up_first():
    """A long prompt that the idle LP can still finish in time: the pooled plan sets it
    aside (0.6 s mean backlog + 0.8 s > 1 s); while its class is protected the plan places
    each request on the LP that frees up first, and it is served there."""
    long = w("long", 1.0, 0.8, 3)
    pooled = plan([long], UNEVEN, [], now=0.0, bound=1e9, shed=Shed.DROP)
    assert [x.key for x in pooled.shed] == ["long"]
    per_lp = plan([long], UNEVEN, [], now=0.0, bound=1e9, shed=Shed.DROP,
                  protected=frozenset({3}))
    assert per_lp.shed == [] and [(x.key, lp) for x, lp in per_lp.to_lp] == [("long", 0)]


def test_per_lp_a_request_set_aside_gives_its_time_back_to_its_own_lp():
    """Two prompts for the idle LP (the busy ones cannot finish either in time): the
    short one is set aside for the protected long one, and a third request that fits
    only once that time is given back is kept."""
    queue = [w("short", 0.35, 0.3, 0), w("long", 1.0, 0.8, 3), w("next", 1.65, 0.8, 0)]
    out = plan(queue, UNEVEN, [], now=0.0, bound=1e9, shed=Shed.DROP,
               protected=frozenset({3}))
    assert [x.key for x in out.shed] == ["short"]
    assert sorted(x.key for x, _ in out.to_lp) == ["long", "next"]


def test_classes_are_quartiles_of_recent_prompts():
    assert quartile_bounds(list(range(100))) == (25, 50, 75)
    classes = PromptClasses(floor=0.8)
    for n in range(100):
        classes.arrived(n)
    assert classes.bounds == (25, 50, 75)
    assert [classes.of(n) for n in (0, 24, 25, 74, 75, 10_000)] == [0, 0, 1, 2, 3, 3]


def test_a_class_is_protected_while_its_record_is_under_the_floor_plus_a_margin():
    classes = PromptClasses(floor=0.8)
    for n in range(100):
        classes.arrived(n)
    for i in range(MIN_OUTCOMES):
        classes.answered(90, met=i % 5 != 0)  # 80 %: under 80 % + the margin
        classes.answered(10, met=True)
    assert classes.protected() == frozenset({3})
    for _ in range(200):  # its record recovers: the oldest answers leave the window
        classes.answered(90, met=True)
    assert classes.protected() == frozenset()
    # no floor: nothing is ever protected
    off = PromptClasses(floor=0.0)
    off.arrived(1)
    for _ in range(MIN_OUTCOMES):
        off.answered(1, met=False)
    assert off.protected() == frozenset()


def test_in_bursts_no_class_is_protected_and_after_them_the_record_counts_again():
    classes = PromptClasses(floor=0.8)
    for n in range(100):
        classes.arrived(n)
    for _ in range(MIN_OUTCOMES):
        classes.answered(90, met=False)
    classes.in_bursts = True
    assert classes.protected() == frozenset()
    classes.in_bursts = False
    assert classes.protected() == frozenset({3})
