"""Fair shares, priority bands and sheddable traffic in the waiting room's plan
(policies/tenants.py, policies/global_queue.py): who is set aside when the box is
saturated, and that nothing changes when it is not.

Covers: policies/tenants.py, policies/global_queue.py.
"""
from __future__ import annotations

from policies.global_queue import Lane, Shed, Waiting, plan
from policies.tenants import TenantShares


def waiting(key: str, tenant: str = "a", cost: float = 0.1, deadline: float = 1.0,
            priority: int = 0, arrival: float = 0.0, favoured: bool = False) -> Waiting:
    return Waiting(key, arrival, deadline, cost, cost, priority, tenant=tenant,
                   tokens=round(cost * 10_000), favoured=favoured)


def shares(**counters: float) -> TenantShares:
    s = TenantShares()
    for tenant in counters:
        s.arrived(tenant)
    s.counters.update(counters)
    return s


def dropped(p) -> set[str]:
    return {w.key for w in p.shed}


def test_a_second_tenant_in_the_box_starts_the_counting_and_is_lifted_to_the_least():
    s = TenantShares(weights={"b": 2.0})
    s.arrived("a")
    s.computed("a", 100)
    assert not s.counting and s.counters.get("a", 0.0) == 0.0   # one tenant: nothing to share
    s.arrived("b")
    assert s.counting
    s.computed("a", 100)
    s.computed("b", 100)                  # weight 2: half the counter
    assert s.counters == {"a": 100.0, "b": 50.0}
    s.ended("b")
    s.arrived("b")                         # it had nothing in the box: lifted, no credit
    assert s.counters["b"] == 100.0


def test_counters_of_tenants_gone_are_forgotten_when_a_lift_would_restore_them():
    s = TenantShares()
    s.arrived("stay")
    s.computed("stay", 10)
    for i in range(500):                   # many one-off ids, each served less than "stay"
        s.arrived(f"id{i}")
        s.ended(f"id{i}")
    assert len(s.counters) < 2 * len(s.live) + 64 + 2
    s.arrived("id7")                       # back: lifted as if it had been remembered
    assert s.counters["id7"] == s.counters["stay"]


def test_favoured_tenants_are_those_under_the_top():
    s = shares(heavy=500.0, light=100.0)
    assert s.favoured() == {"light"}
    assert shares(a=100.0, b=100.0).favoured() == frozenset()   # equal: none


def test_under_saturation_the_tenant_furthest_over_its_share_is_set_aside():
    # 20 requests of 0.1 s on one LP, all due in 1 s: 10 fit. Heavy has had far more.
    queue = [waiting(f"h{i}", "heavy", arrival=i * 1e-3) for i in range(15)]
    queue += [waiting(f"l{i}", "light", arrival=0.5 + i * 1e-3) for i in range(5)]
    blind = plan(queue, [Lane(0, 0.0)], [], 0.0, 10.0, Shed.DROP)
    fair = plan(queue, [Lane(0, 0.0)], [], 0.0, 10.0, Shed.DROP,
                shares=shares(heavy=1e6, light=0.0))
    assert len(blind.shed) == len(fair.shed) == 10
    assert not any(k.startswith("l") for k in dropped(fair))        # light keeps all 5
    assert any(k.startswith("l") for k in dropped(blind))           # tenant-blind: it pays


def test_weights_split_what_is_kept():
    # Both tenants backlogged with equal counters; weight 2:1 keeps about 2:1 of the tokens.
    queue = [waiting(f"{t}{i}", t, arrival=i * 1e-3) for t in "ab" for i in range(30)]
    s = shares(a=0.0, b=0.0)
    s.weights = {"a": 2.0}
    p = plan(queue, [Lane(0, 0.0)], [], 0.0, 100.0, Shed.DROP, shares=s)
    kept = [w.tenant for w, _ in p.to_lp] + [w.tenant for w in p.order]
    assert len(kept) == 10
    assert abs(kept.count("a") - 2 * kept.count("b")) <= 1


def test_sheddable_requests_go_first_and_only_when_saturated():
    queue = [waiting(f"s{i}", priority=-1, arrival=i * 1e-3) for i in range(8)]
    queue += [waiting(f"n{i}", arrival=0.1 + i * 1e-3) for i in range(8)]
    over = plan(queue, [Lane(0, 0.0)], [], 0.0, 100.0, Shed.DROP)
    assert len(over.shed) == 6 and all(k.startswith("s") for k in dropped(over))  # 10 fit
    assert over.saturated is False   # only sheddable ones were set aside
    under = plan(queue[:5] + queue[8:13], [Lane(0, 0.0)], [], 0.0, 100.0, Shed.DROP)
    assert not under.shed                                              # 10 fit: none shed
    saturated = plan(queue[:5] + queue[8:13], [Lane(0, 0.0)], [], 0.0, 100.0, Shed.DROP,
                     saturated=True)
    assert dropped(saturated) == {f"s{i}" for i in range(5)}          # shed on sight
    assert not saturated.saturated


def test_a_favoured_request_jumps_the_lp_backlog_and_is_rescued_first():
    # The LP's backlog (0.9 s) leaves no room for anyone due in 1 s, but a favoured request
    # is served first at the instance; the HP has room for one rescue.
    queue = [waiting("h", "heavy", cost=0.3), waiting("l", "light", cost=0.3, favoured=True)]
    s = shares(heavy=1e6, light=0.0)
    p = plan(queue, [Lane(0, 0.9)], [Lane(1, 0.5)], 0.0, 10.0, Shed.DROP, shares=s)
    assert [w.key for w, _ in p.to_lp] == ["l"]
    assert dropped(p) == {"h"}    # the HP keeps room for the under-served tenant


def test_one_tenant_and_one_band_plan_as_before():
    queue = [waiting(f"r{i}", cost=0.05 * (1 + i % 4), arrival=i * 1e-3) for i in range(40)]
    lanes = [Lane(0, 0.2), Lane(1, 0.1)]
    before = plan(queue, lanes, [Lane(2, 0.0)], 0.0, 0.5, Shed.DROP)
    after = plan(queue, lanes, [Lane(2, 0.0)], 0.0, 0.5, Shed.DROP, shares=shares(a=5.0))
    assert before == after
