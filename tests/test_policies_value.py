"""Value functions and value ordering (paper §5.2).

Covers: policies/value.py, policies/predictor.py.
"""
from __future__ import annotations


import numpy as np
import pytest

from policies.predictor import LinearPredictor, MemoPredictor, ZeroPredictor
from policies.value import (
    VALUE_FUNCTIONS, edf, fcfs, get_value_function, ljf, order_by_value, sjf, slack,
)
from tests.policy_fakes import FakeRequest, names

PREDICTOR = LinearPredictor(seconds_per_token=0.001, fixed=0.01)
BUDGET = 512


def order(requests, value_fn, now=0.0):
    return names(order_by_value(requests, now, value_fn, PREDICTOR, BUDGET))


def test_edf_key_is_deadline_minus_chunked_prefill_of_what_is_left():
    r = FakeRequest("r", 2000, deadline=5.0, num_computed_tokens=0)
    assert edf(r, 0.0, PREDICTOR, BUDGET) == pytest.approx(5.0 - (4 * 0.01 + 2000 * 0.001))
    r.num_computed_tokens = 1000  # only the other 1,000 tokens are left
    assert edf(r, 0.0, PREDICTOR, BUDGET) == pytest.approx(5.0 - (2 * 0.01 + 1000 * 0.001))


def test_edf_puts_a_later_short_request_with_an_earlier_latest_start_first():
    early_long = FakeRequest("early_long", 100, arrival_time=0.0, deadline=2.0)  # start by 1.89
    late_short = FakeRequest("late_short", 10, arrival_time=0.5, deadline=1.5)   # start by 1.48
    assert order([early_long, late_short], edf) == ["late_short", "early_long"]
    assert order([early_long, late_short], fcfs) == ["early_long", "late_short"]


def test_requests_whose_ttft_is_lost_go_behind_the_others_when_asked():
    # At t=1.0: "overdue" can no longer make its deadline, so EDF would run it first and
    # make the others late too; demoted, it runs after them. A started prefill stays put.
    overdue = FakeRequest("overdue", 100, arrival_time=0.0, deadline=0.5)
    started = FakeRequest("started", 100, arrival_time=0.0, deadline=0.6, num_computed_tokens=50)
    live_a = FakeRequest("live_a", 100, arrival_time=0.5, deadline=1.5)
    live_b = FakeRequest("live_b", 100, arrival_time=0.6, deadline=1.6)
    waiting = [overdue, started, live_a, live_b]
    assert order(waiting, edf, now=1.0) == ["overdue", "started", "live_a", "live_b"]
    demoted = order_by_value(waiting, 1.0, edf, PREDICTOR, BUDGET, demote_unreachable=True)
    assert names(demoted) == ["started", "live_a", "live_b", "overdue"]


def test_edf_starts_a_long_prompt_before_a_short_one_with_the_same_deadline():
    short = FakeRequest("short", 10, arrival_time=0.0, deadline=5.0)
    long = FakeRequest("long", 2000, arrival_time=1.0, deadline=5.0)
    assert order([short, long], edf) == ["long", "short"]


def test_slack_runs_short_prompts_first_while_the_long_one_can_wait():
    long = FakeRequest("long", 1000, arrival_time=0.0, deadline=10.0)   # 1.02 s of prefill
    short = FakeRequest("short", 100, arrival_time=0.0, deadline=10.0)  # 0.11 s
    assert order([long, short], slack) == ["short", "long"]
    assert order([long, short], edf) == ["long", "short"]


def test_slack_promotes_a_long_prompt_as_its_slack_runs_out():
    long = FakeRequest("long", 1000, arrival_time=0.0, deadline=1.5)    # 0.48 s to spare
    short = FakeRequest("short", 100, arrival_time=0.0, deadline=10.0)
    assert order([long, short], slack, now=0.0) == ["short", "long"]
    assert order([long, short], slack, now=0.5) == ["long", "short"]  # -0.02 s: its turn


def test_slack_ages_a_waiting_request_ahead_of_a_stream_of_newer_short_ones():
    old = FakeRequest("old", 1000, arrival_time=0.0, deadline=100.0)
    for now, first in ((5.0, "new"), (12.0, "old")):  # 1.02 s of prefill less 0.1 s per s
        new = FakeRequest("new", 100, arrival_time=now, deadline=now + 100.0)
        assert order([old, new], slack, now=now)[0] == first


def test_priority_class_dominates_every_value_function():
    free = FakeRequest("free", 10, arrival_time=0.0, deadline=1.0, priority=0)
    premium = FakeRequest("premium", 3000, arrival_time=9.0, deadline=99.0, priority=1)
    for fn in VALUE_FUNCTIONS.values():
        assert order([free, premium], fn) == ["premium", "free"]


def test_sjf_ljf_and_fcfs_orders():
    a = FakeRequest("a", 300, arrival_time=0.0)
    b = FakeRequest("b", 10, arrival_time=1.0)
    c = FakeRequest("c", 900, arrival_time=2.0)
    assert order([a, b, c], sjf) == ["b", "a", "c"]
    assert order([a, b, c], ljf) == ["c", "a", "b"]
    assert order([c, b, a], fcfs) == ["a", "b", "c"]


def test_ties_go_by_arrival_then_queue_order():
    first = FakeRequest("first", 100, arrival_time=1.0)
    second = FakeRequest("second", 100, arrival_time=2.0)
    twin = FakeRequest("twin", 100, arrival_time=2.0)
    assert order([twin, second, first], sjf) == ["first", "twin", "second"]


def test_value_functions_are_selectable_by_name():
    assert get_value_function("edf") is edf
    assert set(VALUE_FUNCTIONS) == {"edf", "sjf", "ljf", "fcfs", "slack"}
    with pytest.raises(ValueError, match="edf.*fcfs|fcfs.*edf"):
        get_value_function("lifo")


class CountingPredictor(LinearPredictor):
    calls = 0

    def prefill_time(self, num_tokens, already=0, token_budget=None):
        CountingPredictor.calls += 1
        return super().prefill_time(num_tokens, already, token_budget)


def test_memo_predictor_answers_the_same_and_asks_once_per_question():
    inner = CountingPredictor(seconds_per_token=0.001, fixed=0.01)
    memo = MemoPredictor(inner)
    requests = [FakeRequest(f"r{i}", 100 + i % 3, deadline=5.0) for i in range(30)]
    plain = order_by_value(requests, 0.0, edf, inner, BUDGET)
    CountingPredictor.calls = 0
    for _ in range(3):
        assert order_by_value(requests, 0.0, edf, memo, BUDGET) == plain
    assert CountingPredictor.calls == 3  # three distinct prompt lengths
    memo.clear()
    order_by_value(requests, 0.0, edf, memo, BUDGET)
    assert CountingPredictor.calls == 6


def test_every_predictor_answers_many_questions_as_it_answers_one():
    tokens, already = np.array([0, 1, 511, 512, 513, 4000]), np.array([0, 9, 0, 100, 0, 7])
    for predictor in (LinearPredictor(seconds_per_token=0.001, fixed=0.01), ZeroPredictor(),
                      MemoPredictor(LinearPredictor(seconds_per_token=0.003, fixed=0.002))):
        for budget in (None, 512):
            assert predictor.prefill_times(tokens, already, budget).tolist() == [
                predictor.prefill_time(int(n), int(a), budget) for n, a in zip(tokens, already)]

