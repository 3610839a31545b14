"""bench/loadgen/arrivals.py: rates, burstiness (gamma gaps) and seeding.

Covers: bench/loadgen/arrivals.py.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from bench.loadgen.arrivals import arrival_offsets, arrivals_within, gaps


def _cv(x: np.ndarray) -> float:
    return float(x.std() / x.mean())


def test_mean_rate_matches_the_request_rate():
    offsets = arrival_offsets(50_000, rate=8.0, seed=1)
    assert offsets[0] == 0.0 and np.all(np.diff(offsets) >= 0)
    assert (len(offsets) - 1) / offsets[-1] == pytest.approx(8.0, rel=0.03)


@pytest.mark.parametrize("burstiness, cv", [(1.0, 1.0), (0.25, 2.0), (4.0, 0.5)])
def test_burstiness_sets_the_coefficient_of_variation(burstiness, cv):
    between = gaps(50_000, rate=5.0, burstiness=burstiness, rng=np.random.default_rng(2))
    assert between.mean() == pytest.approx(1 / 5.0, rel=0.05)
    assert _cv(between) == pytest.approx(cv, rel=0.06)


def test_poisson_counts_per_window_have_variance_equal_to_mean():
    offsets = arrival_offsets(40_000, rate=10.0, seed=3)
    counts = np.bincount(offsets.astype(int))[:-1]  # whole 1 s windows
    assert counts.var() / counts.mean() == pytest.approx(1.0, rel=0.1)


def test_seeded_is_deterministic_and_seeds_differ():
    a, b = arrival_offsets(100, 3.0, 0.5, seed=7), arrival_offsets(100, 3.0, 0.5, seed=7)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, arrival_offsets(100, 3.0, 0.5, seed=8))


def test_a_duration_run_is_a_prefix_of_a_counted_run():
    full = arrival_offsets(500, rate=20.0, seed=4)
    within = arrivals_within(10.0, rate=20.0, seed=4)
    assert np.all(within < 10.0) and len(within) == int(np.sum(full < 10.0))
    assert np.allclose(within, full[:len(within)])


def test_infinite_rate_sends_everything_at_once():
    assert np.array_equal(arrival_offsets(5, math.inf), np.zeros(5))
    with pytest.raises(ValueError):
        arrivals_within(1.0, math.inf)


@pytest.mark.parametrize("rate, burstiness", [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0), (1.0, math.nan)])
def test_bad_parameters_are_refused(rate, burstiness):
    with pytest.raises(ValueError):
        arrival_offsets(10, rate, burstiness)
