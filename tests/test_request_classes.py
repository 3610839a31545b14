"""Who pays (bench/records/request_classes.py): request classes, the fair floor on the
steady-state rule, token-weighted goodput, and the fair hardware ceiling.

Covers: bench/records/request_classes.py.
"""
from __future__ import annotations

import msgspec
import pytest

from bench.records.schema import RequestRecord
from bench.ruler.ceiling import ceiling_qps
from bench.records.request_classes import RequestClasses, class_goodput, token_goodput_pct
from bench.ruler.steady_state import MeasureRule, judge
from tests.test_ceiling import LinearProfile

SLO = (1.0, 0.15)
WHOLE = MeasureRule(warmup=0.0, cooldown=0.0)


def record(index: int, prompt_len: int, good: bool, slo_class: str | None = None,
           ) -> RequestRecord:
    """Completed on time (TTFT 0.5 s), or dropped."""
    if not good:
        return RequestRecord(index=index, arrival=float(index), prompt_len=prompt_len,
                             output_len=2, outcome="dropped", slo_class=slo_class)
    first = index + 0.5
    return RequestRecord(index=index, arrival=float(index), prompt_len=prompt_len,
                         output_len=2, outcome="completed", first_token_time=first,
                         token_times=[first, first + 0.1], end_time=first + 0.1,
                         slo_class=slo_class)


def test_classes_are_the_quartiles_of_the_prompt_lengths():
    classes = RequestClasses.from_prompts(list(range(1, 101)))
    assert classes.prompt_bounds == (26, 51, 76)
    assert classes.prompt_labels() == ["prompt <26", "prompt 26-50", "prompt 51-75",
                                       "prompt >=76"]
    assert [classes.prompt_class(n) for n in (1, 25, 26, 75, 76, 10_000)] == [0, 0, 1, 2, 3, 3]
    # a trace of one length has one class
    assert RequestClasses.from_prompts([64] * 10).prompt_labels() == ["prompt all"]
    with pytest.raises(ValueError):
        RequestClasses.from_prompts([])


def test_refusing_the_longest_prompts_holds_the_rule_but_not_the_floor():
    """92 % goodput overall, every window on target, but the longest quartile gets 68 %:
    the usual rule holds, the fair one does not -- and the class is named."""
    lengths = [100, 1000, 3000, 6000] * 25
    records = [record(i, n, good=not (n == 6000 and i % 25 < 8)) for i, n in enumerate(lengths)]
    classes = RequestClasses.from_prompts(lengths)
    verdict = judge(records, 90.0, *SLO, rule=WHOLE, classes=classes, fair_floor=0.8)
    assert verdict.goodput_pct == 92.0 and verdict.holds
    assert not verdict.fair_holds
    worst = min(verdict.classes, key=lambda c: c.goodput_pct)
    assert worst.name == "prompt >=6000" and worst.goodput_pct == 68.0
    # with no floor the fair rule is the usual one
    assert judge(records, 90.0, *SLO, rule=WHOLE, classes=classes, fair_floor=0.0).fair_holds
    # the refused requests were the biggest: token goodput (81 %) is far below 92 %
    assert verdict.token_goodput_pct == pytest.approx(100 * (1 - 8 * 6002 / (25 * 10108)))


def test_slo_classes_are_classes_too():
    records = [record(i, 100, good=(i % 2 == 0) or i < 60, slo_class="interactive" if i % 2
                      else "batch") for i in range(100)]
    by_name = {c.name: c for c in class_goodput(records, RequestClasses.from_prompts([100]),
                                                 *SLO)}
    assert by_name["slo batch"].goodput_pct == 100.0
    assert by_name["slo interactive"].goodput_pct == 60.0
    assert by_name["prompt all"].requests == 100


def test_token_goodput_weighs_each_request_by_its_tokens():
    records = [record(0, 98, good=True), record(1, 298, good=False)]
    assert token_goodput_pct(records, *SLO) == pytest.approx(25.0)
    assert token_goodput_pct([], *SLO) == 0.0


def test_the_fair_ceiling_lies_between_all_served_and_the_cheapest_share():
    """Refusing the costliest 10 % may not take more than 20 % of one class: with every
    costly request in one class of 10, only 2 of them may go."""
    lengths = [(100, 20)] * 90 + [(5000, 500)] * 10
    classes = [0] * 90 + [1] * 10
    profile = LinearProfile()
    everyone = ceiling_qps(profile, lengths, 1, tbt_slo=10.0)
    cheapest = ceiling_qps(profile, lengths, 1, tbt_slo=10.0, served_share=0.9)
    fair = ceiling_qps(profile, lengths, 1, tbt_slo=10.0, served_share=0.9, fair_floor=0.8,
                       classes=classes)
    assert everyone < fair < cheapest
    # the fair ceiling refused 2 costly and 8 cheap requests: the same as serving these
    kept = [(100, 20)] * 82 + [(5000, 500)] * 8
    assert fair == pytest.approx(ceiling_qps(profile, kept, 1, tbt_slo=10.0) * 100 / 90)
    # a floor of 1 refuses no one
    assert ceiling_qps(profile, lengths, 1, tbt_slo=10.0, served_share=0.9, fair_floor=1.0,
                       classes=classes) == pytest.approx(everyone)


def test_a_ruler_config_refuses_a_floor_outside_zero_to_one():
    from bench.ruler.ruler import RulerConfig
    with pytest.raises(ValueError, match="fair_floor"):
        RulerConfig(fair_floor=1.5)
    assert msgspec.structs.replace(RulerConfig(), fair_floor=0.0).fair_floor == 0.0
