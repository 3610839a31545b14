"""Out-of-order selection (Algorithm 1): take the ordered prefix that fits every budget.

Covers: policies/selection.py.
"""
from __future__ import annotations

import math
import random

import pytest

from engines.kv_cache import BlockManager
from engines.request import Request
from ipc.params import SamplingParams
from policies.predictor import LinearPredictor
from policies.selection import blocks_needed, select_prefills
from tests.policy_fakes import FakeRequest

PREDICTOR = LinearPredictor(seconds_per_token=0.001, fixed=0.0)
ROOMY = dict(token_budget=10_000, free_blocks=10_000, block_size=16, seat_limit=100,
             compute_budget=math.inf, predictor=PREDICTOR)


def select(requests, **budgets):
    return [(r.name, n) for r, n in select_prefills(requests, **{**ROOMY, **budgets})]


def queue(*lengths):
    return [FakeRequest(f"r{i}", n) for i, n in enumerate(lengths)]


def test_takes_everything_that_fits():
    assert select(queue(100, 200, 300)) == [("r0", 100), ("r1", 200), ("r2", 300)]


def test_token_budget_chunks_the_last_one_taken():
    assert select(queue(100, 200, 300), token_budget=400) == [("r0", 100), ("r1", 200), ("r2", 100)]


def test_token_budget_without_chunking_stops_at_the_first_too_long_even_if_a_later_fits():
    picked = select(queue(100, 400, 50), token_budget=300, chunked=False)
    assert picked == [("r0", 100)]


def test_kv_budget_stops_at_the_first_that_does_not_fit_even_if_a_later_would():
    # 16-token blocks: 100 tokens need 7 blocks, 200 need 13, 10 need 1.
    assert select(queue(100, 200, 10), free_blocks=19) == [("r0", 100)]
    assert select(queue(100, 200, 10), free_blocks=20) == [("r0", 100), ("r1", 200)]


def test_seats_stop_selection_but_a_request_holding_blocks_needs_none():
    assert select(queue(10, 10, 10), seat_limit=2) == [("r0", 10), ("r1", 10)]
    holder = FakeRequest("holder", 40, num_computed_tokens=16, block_table=[0])
    assert select([holder, *queue(10, 10)], seat_limit=1) == [("holder", 24), ("r0", 10)]


def test_compute_budget_stops_at_the_first_that_does_not_fit_even_if_a_later_would():
    # 1 ms per token: 0.1 s, then 0.3 s, then 0.01 s.
    assert select(queue(100, 300, 10), compute_budget=0.35) == [("r0", 100)]
    everything = [("r0", 100), ("r1", 300), ("r2", 10)]
    assert select(queue(100, 300, 10), compute_budget=0.42) == everything


def test_an_exact_fit_is_taken():
    assert select(queue(100, 200), token_budget=300, chunked=False) == [("r0", 100), ("r1", 200)]
    assert select(queue(16, 16), free_blocks=2) == [("r0", 16), ("r1", 16)]


def test_only_the_last_taken_is_cut_and_never_when_not_chunked():
    rng = random.Random(0)
    for _ in range(200):
        requests = queue(*(rng.randrange(1, 300) for _ in range(8)))
        budget = rng.randrange(1, 1200)
        for chunked in (True, False):
            picked = select_prefills(requests, **{**ROOMY, "token_budget": budget,
                                                  "chunked": chunked})
            cut = [i for i, (r, n) in enumerate(picked) if n < r.num_uncomputed_tokens]
            assert sum(n for _, n in picked) <= budget
            assert cut == ([] if not chunked else cut[-1:])
            assert not cut or cut[0] == len(picked) - 1


def test_blocks_are_counted_exactly_as_the_block_manager_counts_them():
    kv = BlockManager(num_blocks=1000, block_size=16)
    rng = random.Random(1)
    for _ in range(200):
        request = Request("r", [1] * rng.randrange(1, 400), SamplingParams(max_tokens=4))
        cached = rng.randrange(0, request.num_tokens)
        kv.allocate(request, cached)
        request.num_computed_tokens = cached
        new = rng.randrange(1, request.num_uncomputed_tokens + 1)
        assert blocks_needed(request, new, 16) == kv.blocks_needed(request, new)
        kv.free(request)


@pytest.mark.parametrize("budget", [0, -5])
def test_no_token_budget_takes_nothing(budget):
    assert select(queue(10), token_budget=budget) == []
