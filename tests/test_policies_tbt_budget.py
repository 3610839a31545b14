"""The compute budget: a step may spend the TBT slack running requests have banked; an
HP may overspend it once for a prompt that meets its TTFT only when prefilled whole.

Covers: policies/tbt_budget.py.
"""
import math
from dataclasses import dataclass

import pytest

from policies.tbt_budget import step_time_allowed, tbt_margin, whole_prefill_pays


@dataclass
class Running:
    tbt_slo: float
    first_token_time: float | None
    num_output_tokens: int


def test_a_request_that_ran_fast_can_afford_a_longer_step():
    # 10 tokens since t=0 at 0.05 s each: its mean stays <= 0.15 s after a step of up to 1.05 s
    request = Running(0.15, first_token_time=0.0, num_output_tokens=10)
    assert tbt_margin(request, now=0.45) == pytest.approx(1.05)
    mean_after = (0.45 + 1.05 - 0.0) / 10
    assert mean_after == pytest.approx(0.15)


def test_one_slo_step_is_always_allowed():
    late = Running(0.15, first_token_time=0.0, num_output_tokens=3)  # already behind
    fresh = Running(0.15, first_token_time=None, num_output_tokens=0)
    assert tbt_margin(late, now=1.0) == 0.15
    assert tbt_margin(fresh, now=1.0) == 0.15


def test_the_step_fits_the_tightest_request_and_no_slo_means_no_limit():
    requests = [Running(0.15, 0.0, 10), Running(0.15, 0.4, 2), Running(math.inf, 0.0, 5)]
    assert step_time_allowed(requests, now=0.45) == pytest.approx(0.25)  # 0.15·2 − 0.05
    assert step_time_allowed([Running(math.inf, 0.0, 5)], now=1.0) == math.inf
    assert step_time_allowed([], now=1.0) == math.inf


def test_a_prompt_gets_a_whole_step_only_when_that_alone_makes_its_deadline():
    # 0.3 s of prefill whole, 0.05 s of decodes beside it, 0.5 s to its deadline
    pays = dict(now=0.0, deadline=0.5, decode_seconds=0.05, whole_seconds=0.3)
    # chunks of 0.1 s: three steps of 0.15 s = 0.45 s, in time: no stall needed
    assert not whole_prefill_pays(**pays, chunk_seconds=0.1)
    # chunks of 0.05 s: six steps of 0.1 s = 0.6 s, late; whole: 0.35 s, in time
    assert whole_prefill_pays(**pays, chunk_seconds=0.05)
    # a budget of nothing still counts as progress, never as "for ever"
    assert whole_prefill_pays(**pays, chunk_seconds=0.0)
    # lost even whole (0.5 s of prefill): no one's TBT is spent on it
    assert not whole_prefill_pays(0.0, 0.5, 0.05, 0.5, 0.05)
    # no deadline: chunks always make it
    assert not whole_prefill_pays(0.0, math.inf, 0.05, 0.3, 0.01)
