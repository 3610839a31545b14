"""Tickets, the HP elastic batch and drops (paper §6.1–6.3).

Covers: policies/admission.py.
"""
from __future__ import annotations

import random

import pytest

from policies.admission import (
    DecodeLengthHistory, TicketBook, decode_reserve,
    should_drop, ticket_wanted,
)
from policies.predictor import LinearPredictor
from tests.policy_fakes import FakeRequest

PREDICTOR = LinearPredictor(seconds_per_token=0.001, fixed=0.002)
BUDGET = 512


# ---- tickets ---------------------------------------------------------------------------
def test_an_idle_hp_with_room_wants_a_ticket():
    assert ticket_wanted(0, 3, 128, 0.8, has_open_ticket=False)


@pytest.mark.parametrize("num_waiting, num_running, free_kv, has_open", [
    (1, 3, 0.8, False),    # something is waiting
    (0, 64, 0.8, False),   # half its batch is busy
    (0, 3, 0.1, False),    # KV nearly full
    (0, 3, 0.8, True),     # one ticket already open
])
def test_no_ticket_without_an_empty_queue_room_and_no_open_ticket(num_waiting, num_running,
                                                                  free_kv, has_open):
    assert not ticket_wanted(num_waiting, num_running, 128, free_kv, has_open)


def test_ticket_book_holds_one_ticket_per_hp_and_each_is_taken_once():
    book = TicketBook()
    assert book.open(2)
    assert not book.open(2)
    assert book.open(5)
    assert len(book) == 2
    assert book.take() == 2  # the oldest ticket first
    assert book.take() == 5
    assert book.take() is None
    assert book.open(2)  # a closed ticket can be reopened


def test_a_cancelled_ticket_is_never_handed_out():
    book = TicketBook()
    book.open(1)
    book.open(2)
    book.cancel(1)
    book.cancel(7)  # unknown: nothing happens
    assert not book.is_open(1) and book.is_open(2)
    assert book.take() == 2
    assert book.take() is None


# ---- elastic batch ---------------------------------------------------------------------
def test_history_prior_is_max_tokens_until_there_is_data():
    history = DecodeLengthHistory()
    assert history.expected_remaining(0, 300) == 300
    assert history.expected_remaining(100, 300) == 200


def test_history_expects_the_mean_of_longer_observed_lengths():
    history = DecodeLengthHistory()
    for n in (10, 20, 30, 100):
        history.observe(n)
    assert history.expected_remaining(0, 1000) == pytest.approx(40.0)
    assert history.expected_remaining(25, 1000) == pytest.approx(65 - 25)
    assert history.expected_remaining(25, 50) == 25  # never past max_tokens
    assert history.expected_remaining(100, 1000) == 900  # outlived every observation: prior


def test_history_keeps_only_the_last_window():
    history = DecodeLengthHistory(window=3)
    for n in (1000, 10, 20, 30):
        history.observe(n)
    assert len(history) == 3
    assert history.expected_remaining(0, 5000) == pytest.approx(20.0)
    rng = random.Random(0)
    lengths = [rng.randrange(1, 500) for _ in range(50)]
    for n in lengths:
        history.observe(n)
    for g in (0, 100, 250):
        longer = [n for n in lengths[-3:] if n > g]
        expected = sum(longer) / len(longer) - g if longer else 5000 - g
        assert history.expected_remaining(g, 5000) == pytest.approx(expected)


def decoding(name, prompt, generated, max_tokens, block_size=16):
    request = FakeRequest(name, prompt, num_output_tokens=generated, max_tokens=max_tokens)
    request.num_computed_tokens = request.num_tokens - 1
    request.block_table = list(range(-(-request.num_computed_tokens // block_size)))
    return request


def test_decode_reserve_uses_the_history():
    history = DecodeLengthHistory()
    running = [decoding("a", 100, 4, max_tokens=1000)]  # 104 tokens in 7 blocks
    assert decode_reserve(running, history, 16) == -(-1100 // 16) - 7  # prior: up to max_tokens
    for _ in range(10):
        history.observe(36)
    assert decode_reserve(running, history, 16) == -(-(104 + 32) // 16) - 7


# ---- drops -----------------------------------------------------------------------------
def drop(request, now, drop_expired=True):
    return should_drop(request, now, predictor=PREDICTOR, token_budget=BUDGET,
                       drop_expired=drop_expired)


def test_a_request_is_dropped_only_after_its_slo_is_lost():
    own = PREDICTOR.prefill_time(200, 0, BUDGET)
    request = FakeRequest("r", 200, deadline=1.0)
    assert drop(request, now=0.0) is False
    assert drop(request, now=1.0 - own) is False            # still just reachable
    assert drop(request, now=1.0 - own + 1e-6) is True  # predicted to miss everywhere
    assert drop(request, now=1.5) is True              # missed


def test_no_drops_when_drop_expired_is_off():
    assert drop(FakeRequest("r", 200, deadline=1.0), now=5.0, drop_expired=False) is False


@pytest.mark.parametrize("started", [dict(num_computed_tokens=16), dict(num_preemptions=1)])
def test_a_started_prefill_is_never_dropped(started):
    assert drop(FakeRequest("r", 200, deadline=1.0, **started), now=5.0) is False


def test_no_deadline_never_drops():
    assert drop(FakeRequest("r", 200), now=1e9) is False
