"""GPU profiles over k GPUs (engines/executors/profiles, `<name>@tp<k>`): Vidur's compute rows
at that degree plus two all-reduces a layer; a 70B model fits no single 80 GB GPU; `plan`
searches only the degrees that fit.

Covers: engines/executors/profiles/all_reduce.py, engines/executors/profiles/profile.py, bench/ruler/plan_tp.py.
"""
from __future__ import annotations

import pytest

from bench.ruler.plan_tp import fitting_degrees
from engines.executors.profiles import get_profile
from engines.executors.profiles.all_reduce import load_all_reduce
from policies.batch_shape import BatchShape

PREFILL = BatchShape.of(prefills=[(2048, 0)], decodes=[])
DECODE = BatchShape.of(prefills=[], decodes=[1024] * 64)


def test_tp1_is_the_plain_profile_and_a_larger_degree_is_faster_with_more_kv():
    base = get_profile("a100-llama3-8b")
    assert get_profile("a100-llama3-8b", 1) is base
    two = get_profile("a100-llama3-8b@tp2")
    assert two.tp == 2 and two.name == "a100-llama3-8b@tp2"
    assert two.step_time(PREFILL) < base.step_time(PREFILL)
    assert two.kv_capacity_tokens > base.kv_capacity_tokens
    # the all-reduces are part of the linear time, and only at tp > 1
    assert base.all_reduce_seconds(2048) == 0 < two.all_reduce_seconds(2048)


def test_all_reduce_time_grows_with_the_bytes_and_the_gpus():
    table = load_all_reduce("a100_dgx_all_reduce.csv")
    assert table.seconds(2, 1 << 20) < table.seconds(2, 1 << 26)
    assert table.seconds(2, 1 << 26) < table.seconds(8, 1 << 26)
    assert table.seconds(1, 1 << 26) == 0.0


def test_a_70b_model_needs_several_gpus_and_says_so():
    with pytest.raises(ValueError, match="a larger tp spreads the weights"):
        get_profile("a100-llama3-70b").kv_capacity_tokens
    steps = [get_profile("a100-llama3-70b", k).step_time(DECODE) for k in (2, 4, 8)]
    assert steps == sorted(steps, reverse=True)
    assert [k for k, why in fitting_degrees("a100-llama3-70b", 8) if not why] == [2, 4, 8]
    assert [k for k, why in fitting_degrees("a100-llama3-70b", 6) if not why] == [2]


def test_a_bad_degree_or_name_is_an_error_naming_it():
    with pytest.raises(ValueError, match="unknown GPU profile"):
        get_profile("a100-llama3-70b@tpX")
    with pytest.raises(ValueError, match="64 attention heads are not divisible by tp=3"):
        get_profile("a100-llama2-70b@tp3")
    with pytest.raises(ValueError, match="tp: profile 'a100-llama3-8b@tp2' is at tp 2"):
        get_profile("a100-llama3-8b@tp2", 4)
