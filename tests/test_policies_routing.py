"""Routing (paper §4, §6.1): tickets first, then the pool by one rule; offloads to the idlest HP.

Covers: policies/routing.py, policies/router.py.
"""
from __future__ import annotations

from policies.router import Router
from policies.routing import Routing, least_loaded, round_robin, route_offload


def test_new_requests_round_robin_over_the_pool_without_tickets():
    router = Router(pool=[0, 1], hp_ids=[2], routing=Routing.ROUND_ROBIN)
    assert [router.route_new([0, 1, 2], {0: 9})[0] for _ in range(5)] == [0, 1, 0, 1, 0]


def test_least_loaded_picks_the_fewest_in_flight_ties_in_turn():
    router = Router(pool=[0, 1, 2], routing=Routing.LEAST_LOADED)
    assert router.route_new([0, 1, 2], {0: 3, 1: 1, 2: 5}) == (1, False)
    assert router.route_new([0, 1, 2], {0: 2, 1: 2, 2: 2}) == (2, False)  # after 1
    assert router.route_new([0, 1, 2], {0: 2, 1: 2, 2: 2}) == (0, False)


def test_the_same_rule_serves_an_ascendra_pool_and_a_baseline_alike():
    loads = {0: 4, 1: 0}
    ascendra = Router(pool=[0, 1], hp_ids=[2], routing=Routing.LEAST_LOADED)
    baseline = Router(pool=[0, 1], routing=Routing.LEAST_LOADED)
    assert ascendra.route_new([0, 1, 2], loads) == baseline.route_new([0, 1], loads) == (1, False)


def test_an_open_ticket_takes_the_next_new_request_once():
    router = Router(pool=[0, 1], hp_ids=[2], routing=Routing.ROUND_ROBIN)
    assert router.ticket(2) and not router.ticket(2)  # one open ticket per HP
    assert not router.ticket(0)                       # an LP holds no tickets
    assert router.route_new([0, 1, 2], {}) == (2, True)
    assert router.route_new([0, 1, 2], {}) == (0, False)  # ticket used up: back to the pool


def test_two_hps_with_tickets_each_get_one_request():
    router = Router(pool=[0, 1], hp_ids=[2, 3], routing=Routing.ROUND_ROBIN)
    router.ticket(3)
    router.ticket(2)
    assert [router.route_new([0, 1, 2, 3], {})[0] for _ in range(3)] == [3, 2, 0]


def test_a_pool_with_no_ready_instance_falls_back_to_any_ready_one_else_none():
    router = Router(pool=[0, 1], hp_ids=[2])
    assert router.route_new([2], {}) == (2, False)
    assert router.route_new([], {}) == (None, False)


def test_offloads_go_to_the_hp_with_the_shortest_waiting_queue_ties_to_lowest_id():
    assert route_offload([(2, 4), (3, 1), (4, 7)]) == 3
    assert route_offload([(4, 0), (2, 0)]) == 2
    assert route_offload([]) is None


def test_existing_helpers_still_work():
    assert round_robin([0, 1, 2], last=2) == 0
    assert least_loaded([(0, 3), (1, 1), (2, 1)], last=1) == 2
