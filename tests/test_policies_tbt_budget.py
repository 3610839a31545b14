"""The LP compute budget: a step may spend the TBT slack running requests have banked."""
import math
from dataclasses import dataclass

import pytest

from policies.tbt_budget import step_time_allowed, tbt_margin


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
