"""The hardware ceiling (bench/ruler/ceiling.py): the fluid bound every capacity is read against.

Covers: bench/ruler/ceiling.py.
"""
from __future__ import annotations

import pytest

from bench.loadgen.workload import build_workload
from bench.ruler.ceiling import BUDGETS, ceiling_qps
from engines.executors.profiles.registry import get_profile
from policies.batch_shape import BatchShape


class LinearProfile:
    """A GPU whose step costs `fixed` + `per_token` x tokens computed."""

    def __init__(self, fixed: float = 0.01, per_token: float = 1e-4,
                 kv_capacity_tokens: int = 10**9) -> None:
        self.fixed, self.per_token = fixed, per_token
        self.kv_capacity_tokens = kv_capacity_tokens

    def step_time(self, shape: BatchShape, num_sampling=None) -> float:
        return self.fixed + self.per_token * shape.num_tokens


def test_matches_the_closed_form_of_a_linear_gpu():
    profile, lengths = LinearProfile(), [(900, 100)] * 10
    # qps(C) = C / ((P + O) (fixed + per_token C)): best at the largest budget that fits.
    c = max(BUDGETS)
    expected = c / (1000 * (0.01 + 1e-4 * c))
    assert ceiling_qps(profile, lengths, 1, tbt_slo=10.0) == pytest.approx(expected, rel=0.01)
    assert ceiling_qps(profile, lengths, 3, tbt_slo=10.0) == pytest.approx(3 * expected, rel=0.01)


def test_a_tighter_tbt_target_or_a_smaller_kv_cache_lowers_it():
    lengths = [(900, 100)] * 10
    loose = ceiling_qps(LinearProfile(), lengths, 1, tbt_slo=10.0)
    tight = ceiling_qps(LinearProfile(), lengths, 1, tbt_slo=0.05)
    small_kv = ceiling_qps(LinearProfile(kv_capacity_tokens=50_000), lengths, 1, tbt_slo=10.0)
    assert tight < loose and small_kv < loose
    assert ceiling_qps(LinearProfile(), lengths, 1, tbt_slo=0.001) == 0.0  # no step fits


def test_serving_the_cheapest_share_raises_it():
    lengths = [(100, 20)] * 9 + [(5000, 500)]
    everyone = ceiling_qps(LinearProfile(), lengths, 1, tbt_slo=10.0)
    cheapest = ceiling_qps(LinearProfile(), lengths, 1, tbt_slo=10.0, served_share=0.9)
    assert cheapest > 2 * everyone
    with pytest.raises(ValueError):
        ceiling_qps(LinearProfile(), lengths, 1, tbt_slo=1.0, served_share=0)


def test_the_a100_sharegpt_ceiling_is_near_ten_requests_per_second_on_three_instances():
    """The bound every layout meets on steady Poisson ShareGPT (each reaches ~9 QPS)."""
    lengths = [(r.prompt_len, r.output_len)
               for r in build_workload("sharegpt", rate=1.0, num_requests=3000, seed=0,
                                       max_model_len=8192)]
    ceiling = ceiling_qps(get_profile("a100-llama3-8b"), lengths, 3, tbt_slo=0.15)
    assert 8.5 < ceiling < 12.0
