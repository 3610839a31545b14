"""The controller's waiting queue (policies/global_queue.py): late binding, Moore-Hodgson's
feasible set, HP rescue, shedding.

Covers: policies/global_queue.py.
"""
from __future__ import annotations

import itertools
import random

from policies.global_queue import Lane, Shed, Waiting, plan


def w(key: str, deadline: float, cost: float, arrival: float = 0.0, priority: int = 0,
      hp_cost: float | None = None) -> Waiting:
    return Waiting(key, arrival, deadline, cost, cost if hp_cost is None else hp_cost, priority)


def keys(items) -> list[str]:
    return [(i[0] if isinstance(i, tuple) else i).key for i in items]


def test_an_lp_takes_work_only_while_its_backlog_is_under_the_bound():
    queue = [w("a", 10, 1.0), w("b", 11, 1.0), w("c", 12, 1.0), w("d", 13, 1.0)]
    out = plan(queue, [Lane(0, 0.0), Lane(1, 1.5)], [], now=0.0, bound=2.0)
    # always the lane with the least backlog: 0, 0 (now 2.0 >= bound? no: 1.0), then 1
    assert [(w.key, lane) for w, lane in out.to_lp] == [("a", 0), ("b", 0), ("c", 1)]
    assert keys(out.order) == ["d"]  # waits at the controller for whichever LP frees first


def test_a_burst_is_not_committed_to_one_lp():
    burst = [w(f"r{i}", 100.0, 1.0) for i in range(20)]
    out = plan(burst, [Lane(0, 0.0), Lane(1, 0.0)], [], now=0.0, bound=2.0)
    assert len(out.to_lp) == 4 and len(out.order) == 16


def test_kept_requests_run_in_deadline_order_and_all_meet_their_deadline():
    rng = random.Random(1)
    queue = [w(f"r{i}", rng.uniform(1, 20), rng.uniform(0.1, 3.0)) for i in range(40)]
    out = plan(queue, [Lane(0, 0.0), Lane(1, 0.0)], [], now=0.0, bound=1e9, shed=Shed.DROP)
    kept = [x for x, _ in out.to_lp]
    assert [x.deadline for x in kept] == sorted(x.deadline for x in kept)
    clock = 0.0
    for x in kept:  # the pooled LPs (two: half the time each) drain them in this order
        clock += x.cost / 2
        assert clock <= x.deadline + 1e-9
    assert len(kept) + len(out.shed) == 40 and out.shed


def test_moore_hodgson_keeps_the_most_requests_on_time():
    """On one LP, no subset of a small queue that all meet their deadlines is larger."""
    rng = random.Random(7)
    for _ in range(30):
        queue = [w(f"r{i}", rng.uniform(0.5, 6), rng.uniform(0.2, 2.5)) for i in range(7)]
        out = plan(queue, [Lane(0, 0.0)], [], now=0.0, bound=1e9, shed=Shed.DROP)
        best = max(len(s) for n in range(len(queue) + 1)
                   for s in itertools.combinations(queue, n) if _feasible_alone(s))
        assert len(out.to_lp) == best


def _feasible_alone(subset) -> bool:
    clock = 0.0
    for x in sorted(subset, key=lambda x: x.deadline):
        clock += x.cost
        if clock > x.deadline:
            return False
    return True


def test_the_longest_request_is_set_aside_first_and_rescued_by_an_idle_hp():
    queue = [w("short1", 2.0, 1.0), w("long", 2.5, 2.0), w("short2", 3.0, 1.0)]
    out = plan(queue, [Lane(0, 0.0)], [Lane(9, 0.0)], now=0.0, bound=1e9, shed=Shed.DROP)
    assert keys(out.to_lp) == ["short1", "short2"]
    assert [(x.key, hp) for x, hp in out.to_hp] == [("long", 9)]
    assert not out.shed


def test_a_busy_hp_rescues_only_what_it_can_still_finish():
    queue = [w("a", 1.0, 1.0), w("b", 1.0, 1.0), w("c", 1.0, 1.0)]
    out = plan(queue, [Lane(0, 0.0)], [Lane(9, 0.5)], now=0.0, bound=1e9, shed=Shed.DROP)
    assert keys(out.to_lp) == ["a"] and not out.to_hp  # the HP is 0.5 s busy: 1.5 > 1.0
    assert sorted(keys(out.shed)) == ["b", "c"]


def test_an_hp_rescue_is_priced_at_its_whole_step_share_never_above_its_measured_cost():
    """At its measured rate the HP would take 1.6 s, past the deadline; running the prompt
    whole takes 0.6 of that, 0.96 s, in time. A whole step is never taken to be slower
    than the measured rate."""
    late = w("long", 1.0, 3.0, hp_cost=1.6)
    lps, hps = [Lane(0, 0.0)], [Lane(9, 0.0)]
    assert keys(plan([late], lps, hps, now=0.0, bound=1e9, shed=Shed.DROP).shed) == ["long"]
    whole = plan([late], lps, hps, now=0.0, bound=1e9, shed=Shed.DROP, hp_whole_share=0.6)
    assert [(x.key, hp) for x, hp in whole.to_hp] == [("long", 9)] and not whole.shed
    dearer = plan([w("fits", 1.0, 3.0, hp_cost=0.9)], lps, hps, now=0.0, bound=1e9,
                  shed=Shed.DROP, hp_whole_share=1.5)
    assert keys(dearer.to_hp) == ["fits"]


def test_demoted_requests_wait_behind_the_feasible_ones_oldest_first():
    queue = [w("late-new", 0.5, 1.0, arrival=2.0), w("late-old", 0.5, 1.0, arrival=1.0),
             w("fine", 10.0, 1.0, arrival=3.0)]
    out = plan(queue, [Lane(0, 0.0)], [], now=0.0, bound=0.5, shed=Shed.DEMOTE)
    assert keys(out.to_lp) == ["fine"] and keys(out.order) == ["late-old", "late-new"]
    kept = plan(queue, [Lane(0, 0.0)], [], now=0.0, bound=1e9, shed=Shed.KEEP)
    assert keys(kept.to_lp) == ["late-old", "late-new", "fine"] and not kept.shed


def test_a_higher_priority_class_is_planned_first():
    queue = [w("free", 1.0, 1.0), w("premium", 5.0, 1.0, priority=1)]
    out = plan(queue, [Lane(0, 0.0)], [], now=0.0, bound=1e9, shed=Shed.KEEP)
    assert keys(out.to_lp) == ["premium", "free"]


def test_an_empty_queue_plans_nothing():
    assert plan([], [Lane(0, 0.0)], [], now=0.0, bound=1.0).to_lp == []


def test_a_miss_budget_drops_the_costliest_late_requests_and_demotes_the_rest():
    # one LP 10 s behind: none of these can make its deadline, and no HP can rescue them
    late = [w("cheap", 2.0, 0.5, arrival=0.0), w("dear", 2.0, 3.0, arrival=0.1),
            w("mid", 2.0, 1.0, arrival=0.2)]
    out = plan(late, [Lane(0, 10.0)], [], now=0.0, bound=1e9, shed=Shed.DROP, shed_allowance=1)
    assert keys(out.shed) == ["dear"]
    assert sorted(keys(out.to_lp)) == ["cheap", "mid"]  # demoted: served after the feasible
    everything = plan(late, [Lane(0, 10.0)], [], now=0.0, bound=1e9, shed=Shed.DROP)
    assert sorted(keys(everything.shed)) == ["cheap", "dear", "mid"]


def test_the_miss_allowance_is_the_budget_share_of_recent_arrivals_less_the_drops():
    from policies.global_queue import miss_allowance
    assert miss_allowance(1.0, arrived=100, shed=50) is None   # no limit
    assert miss_allowance(0.1, arrived=100, shed=4) == 6
    assert miss_allowance(0.1, arrived=100, shed=12) == 0
    assert miss_allowance(0.0, arrived=100, shed=0) == 0       # never drop


def test_sheddable_work_at_an_lp_is_not_ahead_of_a_request_that_is_not_sheddable():
    """The LP holds 3 s of sheddable prompts, which it serves after anything else: a
    request due in 2 s is kept and bound there, a sheddable one is late behind them."""
    lanes = [Lane(0, backlog=3.5, sheddable=3.0)]
    out = plan([w("chat", 2.0, 1.0), w("batch", 2.0, 1.0, priority=-1)], lanes, [], now=0.0,
               bound=1.0, shed=Shed.DROP)
    assert keys(out.to_lp) == ["chat"] and keys(out.shed) == ["batch"]


def test_a_late_request_an_hp_rescues_does_not_make_the_box_saturated():
    """Saturated (sheddable requests shed on sight for a while) means a request that is
    not sheddable is late with no HP to take it -- not that one was rescued."""
    late = w("chat", 1.0, 2.0, hp_cost=0.5)
    rescued = plan([late], [Lane(0, 0.0)], [Lane(1, 0.0)], now=0.0, bound=1.0, shed=Shed.DROP)
    assert keys(rescued.to_hp) == ["chat"] and not rescued.saturated
    lost = plan([late], [Lane(0, 0.0)], [Lane(1, 0.8)], now=0.0, bound=1.0, shed=Shed.DROP)
    assert keys(lost.shed) == ["chat"] and lost.saturated


def test_a_prompt_too_long_for_its_target_on_any_instance_does_not_make_the_box_saturated():
    """Shed, but it says nothing of the load: an idle instance would miss it too."""
    hopeless = w("chat", 1.0, 2.0, hp_cost=1.5)
    out = plan([hopeless], [Lane(0, 0.0)], [Lane(1, 0.0)], now=0.0, bound=1.0, shed=Shed.DROP)
    assert keys(out.shed) == ["chat"] and not out.saturated


def test_per_lp_a_short_request_an_idle_lp_can_start_is_not_shed_behind_a_long_prompt():
    """The long-context mix on `3A+esp3` (docs/elastic_sequence_parallelism.md, "3A's
    short class"): one LP runs a 63k-token prompt whole (5 s of backlog), two are idle. On
    the pool the chat request starts after a third of those 5 s, past its 1-s target, and
    is shed; placed on the LP that frees up first it starts at once."""
    chat = w("chat", deadline=1.0, cost=0.1)
    lps = [Lane(0, 5.0), Lane(1, 0.0), Lane(2, 0.0)]
    pooled = plan([chat], lps, [], now=0.0, bound=0.3, shed=Shed.DROP)
    assert keys(pooled.shed) == ["chat"] and not pooled.to_lp
    per_lp = plan([chat], lps, [], now=0.0, bound=0.3, shed=Shed.DROP, per_lp=True)
    assert [(x.key, lane) for x, lane in per_lp.to_lp] == [("chat", 1)] and not per_lp.shed


def test_per_lp_still_sheds_what_no_lp_can_start_in_time():
    """Per LP, a request is late only where every LP's own queue makes it so: two idle LPs
    take two chat requests; a third, behind them and the long prompt on each, is set aside."""
    queue = [w(f"c{i}", deadline=1.0, cost=0.6, arrival=i) for i in range(3)]
    lps = [Lane(0, 5.0), Lane(1, 0.0), Lane(2, 0.0)]
    out = plan(queue, lps, [], now=0.0, bound=1.0, shed=Shed.DROP, per_lp=True)
    assert sorted(lane for _, lane in out.to_lp) == [1, 2] and keys(out.shed) == ["c2"]
