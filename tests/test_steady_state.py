"""The steady-state rule (bench/ruler/steady_state.py): what is measured, and when a point holds.

Covers: bench/ruler/steady_state.py.
"""
from __future__ import annotations

import msgspec

from bench.records.schema import RequestRecord
from bench.ruler.steady_state import MeasureRule, judge, misses_allowed

SLO = (1.0, 0.15)


def record(index: int, good: bool) -> RequestRecord:
    """A completed request, on time (TTFT 0.5 s) or late (TTFT 2 s); two tokens 0.1 s apart."""
    ttft = 0.5 if good else 2.0
    first = index + ttft
    return RequestRecord(index=index, arrival=float(index), prompt_len=10, output_len=2,
                         outcome="completed", first_token_time=first,
                         token_times=[first, first + 0.1], end_time=first + 0.1)


def run(pattern) -> list[RequestRecord]:
    return [record(i, good) for i, good in enumerate(pattern)]


def test_warm_up_and_cool_down_are_left_out():
    rule = MeasureRule()
    assert rule.requests_for(4500) == 5625 and rule.span(5625) == (562, 5063)
    # 100 requests: the first 10 and the last 10 miss, the middle 80 are on time
    records = run([False] * 10 + [True] * 80 + [False] * 10)
    verdict = judge(records, 90.0, *SLO)
    assert verdict.num_measured == 80 and verdict.goodput_pct == 100.0 and verdict.holds
    assert [r.index for r in rule.measured(list(reversed(records)))] == list(range(10, 90))


def test_priming_requests_are_never_measured_and_the_shares_apply_after_them():
    rule = MeasureRule()
    assert rule.span(1030, primed=30) == (130, 930)
    # 30 priming requests that all miss (a cold cache), then 100 as above
    primed = [msgspec.structs.replace(r, warmup=True) for r in run([False] * 30)]
    rest = [msgspec.structs.replace(r, index=r.index + 30, arrival=r.arrival + 30)
            for r in run([False] * 10 + [True] * 80 + [False] * 10)]
    verdict = judge(primed + rest, 90.0, *SLO)
    assert verdict.num_measured == 80 and verdict.goodput_pct == 100.0 and verdict.holds
    assert misses_allowed(130, 90.0, rule, primed=30) == misses_allowed(100, 90.0, rule)


def test_a_run_whose_last_window_sinks_fails_though_its_mean_passes():
    # measured: 4 windows of 20 -- 100 %, 100 %, 100 %, 80 % (mean 95 %, last 10 under)
    middle = [True] * 60 + [True] * 16 + [False] * 4
    verdict = judge(run([True] * 10 + middle + [True] * 10), 90.0, *SLO)
    assert verdict.goodput_pct == 95.0 and verdict.window_goodput_pct == [100, 100, 100, 80]
    assert not verdict.holds
    # a window may dip below the target by the slack (3 points), no more
    whole = MeasureRule(warmup=0.0, cooldown=0.0)  # windows of 25
    dip = run([True] * 75 + [True] * 22 + [False] * 3)  # last window 88 %
    assert judge(dip, 90.0, *SLO, rule=whole).window_goodput_pct[-1] == 88.0
    assert judge(dip, 90.0, *SLO, rule=whole).holds
    deeper = run([True] * 75 + [True] * 21 + [False] * 4)  # 84 %: more than 3 under
    assert not judge(deeper, 90.0, *SLO, rule=whole).holds


def test_a_mean_under_the_target_fails_whatever_the_windows():
    verdict = judge(run([True] * 10 + [True, True, True, True, False] * 16 + [True] * 10), 90.0, *SLO)
    assert verdict.goodput_pct == 80.0 and not verdict.holds


def test_misses_beyond_the_allowance_mean_the_point_cannot_hold():
    assert misses_allowed(5625, 90.0) == 450  # 10 % of the 4,501 measured, rounded down
    assert misses_allowed(100, 90.0) == 8
