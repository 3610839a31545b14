"""Routing (paper §4, §6.1): tickets first, then LP round-robin; offloads to the idlest HP."""
from __future__ import annotations

from policies.admission import TicketBook
from policies.routing import least_loaded, round_robin, route_new, route_offload


def test_new_requests_round_robin_over_lp_without_tickets():
    book = TicketBook()
    last, seen = -1, []
    for _ in range(5):
        target, via_ticket = route_new(book, [0, 1], last)
        assert not via_ticket
        seen.append(target)
        last = target
    assert seen == [0, 1, 0, 1, 0]


def test_an_open_ticket_takes_the_next_new_request_once():
    book = TicketBook()
    book.open(2)
    assert route_new(book, [0, 1], last_lp=0) == (2, True)
    assert route_new(book, [0, 1], last_lp=0) == (1, False)  # ticket used up: back to LP


def test_two_hps_with_tickets_each_get_one_request():
    book = TicketBook()
    book.open(3)
    book.open(2)
    assert not book.open(3)
    assert [route_new(book, [0, 1])[0] for _ in range(3)] == [3, 2, 0]


def test_no_instance_at_all():
    assert route_new(TicketBook(), []) == (None, False)


def test_offloads_go_to_the_hp_with_the_shortest_waiting_queue_ties_to_lowest_id():
    assert route_offload([(2, 4), (3, 1), (4, 7)]) == 3
    assert route_offload([(4, 0), (2, 0)]) == 2
    assert route_offload([]) is None


def test_existing_helpers_still_work():
    assert round_robin([0, 1, 2], last=2) == 0
    assert least_loaded([(0, 3), (1, 1), (2, 1)], last=1) == 2
