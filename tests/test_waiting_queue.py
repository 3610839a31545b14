"""The scheduler's waiting queue, and the triage over it, against plain references.

`WaitingQueue` must behave as the deque it replaced (order, removal anywhere, the front
for preempted requests) while its columns stay row for row with its requests and its
predictions follow the predictor's refits. `Triage.run` must drop, order and offload
exactly as the per-request policies composed the obvious way.

Covers: engines/waiting_queue.py, engines/triage.py.
"""
from __future__ import annotations

import random
from collections import deque

import numpy as np
import pytest

from engines.modes import get_mode
from engines.request import Request
from engines.scheduler_config import SchedulerConfig
from engines.triage import Triage
from engines.waiting_queue import WaitingQueue
from ipc.params import SamplingParams
from policies.admission import should_drop
from engines.perf.hardware_spec import HARDWARE
from engines.perf.model_shape import ModelShape
from policies.offload import plan_offloads
from engines.perf.calibration_shapes import calibration_shapes
from engines.perf.features import times
from engines.perf.model import PerfModel, feature_rows
from policies.predictor import LinearPredictor, MemoPredictor, remaining_prefill_time
from policies.value import get_value_function, order_by_value

BUDGET = 512
SAMPLING = SamplingParams(max_tokens=16)
LLAMA3_8B = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                       intermediate=14336, vocab=128256)


def perf_model() -> PerfModel:
    return PerfModel(LLAMA3_8B, HARDWARE["a100"], coeffs=[0.3, 1.2, 0.4, 0.1, 0.004])


def refit_towards(perf: PerfModel, coeffs: list[float]) -> None:
    """Feed `perf` batches timed by other coefficients, and refit it: they change."""
    before = perf.coefficients
    for shape in calibration_shapes(BUDGET, 4096, 64, max_kv_tokens=100_000):
        perf.observe(shape, float(feature_rows(*times(shape, perf.model, perf.hw)) @ coeffs))
    assert perf.refit() and perf.coefficients != before


def random_request(rng: random.Random, i: int, now: float = 0.0) -> Request:
    prompt = rng.choice([1, 16, 512, 513, rng.randint(1, 3000)])
    arrival = rng.choice([now, now - 0.5, rng.uniform(now - 3.0, now)])
    request = Request(f"r{i}", [1] * prompt, SAMPLING, arrival_time=arrival,
                      deadline=arrival + rng.choice([0.5, 2.0, 30.0, float("inf")]),
                      priority=rng.choice([0, 0, 0, 1, -1]), pinned=rng.random() < 0.05)
    if rng.random() < 0.1:  # preempted once: it counts as started
        request.num_preemptions = 1
    return request


def assert_columns_match(queue: WaitingQueue, predictor) -> None:
    columns, requests = queue.columns()
    assert sorted(map(id, requests)) == sorted(map(id, queue))
    in_queue_order = [requests[i] for i in np.argsort(columns.position)]
    assert in_queue_order == list(queue)
    for row, request in enumerate(requests):
        assert columns.own[row] == remaining_prefill_time(request, predictor, BUDGET)
        assert columns.deadline[row] == request.deadline
        assert columns.arrival[row] == request.arrival_time
        assert columns.priority[row] == request.priority
        assert columns.started[row] == request.prefill_started
    assert queue.uncomputed_tokens() == sum(r.num_uncomputed_tokens for r in queue)
    assert queue.sheddable_uncomputed_tokens() == sum(  # sheddable: a negative priority class
        r.num_uncomputed_tokens for r in queue if r.priority < 0)


@pytest.mark.parametrize("seed", range(5))
def test_waiting_queue_behaves_as_a_deque_with_columns_row_for_row(seed):
    rng = random.Random(seed)
    predictor = LinearPredictor(seconds_per_token=0.001, fixed=0.002)
    queue, model = WaitingQueue(predictor, BUDGET), deque()
    for i in range(600):
        action = rng.random()
        if action < 0.5 or not model:
            request, end = random_request(rng, i), rng.choice(["append"] * 4 + ["appendleft"])
            getattr(queue, end)(request)
            getattr(model, end)(request)
        elif action < 0.7:
            victim = rng.choice(list(model))
            queue.remove(victim)
            model.remove(victim)
        elif action < 0.8:
            victims = rng.sample(list(model), rng.randint(0, min(len(model), 40)))
            rows_before = queue.columns()[1].copy()
            moved = queue.remove_many(victims)
            rows_after = queue.columns()[1]
            assert all(rows_after[new] is rows_before[old] for old, new in moved.items())
            assert all(rows_after[row] is rows_before[row]  # the rest stayed where they were
                       for row in range(len(rows_after)) if row not in moved.values())
            for victim in victims:
                model.remove(victim)
        else:
            assert queue.popleft() is model.popleft()
        assert list(queue) == list(model) and len(queue) == len(model)
        if i % 25 == 0:
            assert_columns_match(queue, predictor)
    assert_columns_match(queue, predictor)
    with pytest.raises(ValueError):
        queue.remove(random_request(rng, -1))
    with pytest.raises(ValueError):
        queue.remove_many([random_request(rng, -2), random_request(rng, -3)])


@pytest.mark.parametrize("seed", range(3))
def test_last_order_is_the_remembered_order_then_the_newcomers(seed):
    """What the triage starts its next sort from: the order it last remembered, less the
    requests that left, then those that joined since (either end) in the order they
    joined, whatever rows removals moved them to."""
    rng = random.Random(seed)
    queue = WaitingQueue(LinearPredictor(seconds_per_token=0.001), BUDGET)
    expected: list = []
    for i in range(400):
        action = rng.random()
        if action < 0.5 or not len(queue):
            request = random_request(rng, i)
            getattr(queue, rng.choice(["append", "appendleft"]))(request)
            expected.append(request)
        elif action < 0.7:
            victims = rng.sample(list(queue), rng.randint(1, min(len(queue), 10)))
            queue.remove_many(victims) if len(victims) > 1 else queue.remove(victims[0])
            expected = [r for r in expected if r not in victims]
        else:
            order = np.array(rng.sample(range(len(queue)), len(queue)), dtype=np.intp)
            queue.remember_order(order)
            expected = queue.columns()[1][order].tolist()
        assert queue.columns()[1][queue.last_order()].tolist() == expected


def test_an_empty_queue_pops_nothing():
    queue = WaitingQueue(LinearPredictor(seconds_per_token=0.001), BUDGET)
    assert not queue and len(queue) == 0 and list(queue) == []
    with pytest.raises(IndexError):
        queue.popleft()


def test_predictions_follow_a_refit_without_asking_request_by_request():
    perf, rng = perf_model(), random.Random(3)
    memo = MemoPredictor(perf)
    queue = WaitingQueue(memo, BUDGET)
    for i in range(300):
        queue.append(random_request(rng, i))
    before = queue.columns()[0].own.copy()
    version = memo.version
    refit_towards(perf, [0.1, 2.0, 0.3, 0.2, 0.01])
    memo.clear()  # the engine's part of a refit
    assert memo.version != version
    columns, requests = queue.columns()
    assert not np.array_equal(columns.own, before)
    assert columns.own.tolist() == [remaining_prefill_time(r, memo, BUDGET) for r in requests]
    assert queue.predicted_seconds() == [
        remaining_prefill_time(r, memo, BUDGET) for r in queue]


def test_a_memo_predictor_has_the_version_of_the_model_it_wraps():
    perf = perf_model()
    memo = MemoPredictor(perf)
    version = memo.version
    memo.prefill_time(100)
    memo.clear()
    assert memo.version == version == perf.version
    refit_towards(perf, [0.1, 2.0, 0.3, 0.2, 0.01])
    assert memo.version == perf.version != version


def reference_triage(mode: str, config: SchedulerConfig, predictor, waiting: list[Request],
                     now: float, next_batch_time: float):
    """What Triage decides, the obvious way: the per-request policies, composed."""
    mode_ = get_mode(mode)
    dropped = [r for r in waiting if should_drop(r, now, predictor=predictor,
                                                  token_budget=BUDGET,
                                                  drop_expired=config.drop_expired)]
    staying = [r for r in waiting if r not in dropped]
    if mode_.by_value:
        value_fn = get_value_function(mode_.value_function or config.value_function)
        staying = order_by_value(staying, now, value_fn, predictor, BUDGET,
                                 demote_unreachable=mode_.demote_unreachable)
    offloaded = []
    if mode_.offloads:
        offloaded, _ = plan_offloads(staying, now, predictor=predictor, token_budget=BUDGET,
                                     next_batch_time=next_batch_time,
                                     threshold=config.offload_threshold,
                                     ipc_delay=config.offload_ipc_delay)
        staying = [r for r in staying if r not in offloaded]
    return staying, offloaded, dropped


@pytest.mark.parametrize("mode", ["lp", "hp", "sarathi"])
@pytest.mark.parametrize("drop_expired", [False, True])
@pytest.mark.parametrize("value_function", ["slack", "edf", "fcfs"])
def test_triage_decides_as_the_per_request_policies(mode, drop_expired, value_function):
    rng = random.Random(f"{mode} {drop_expired} {value_function}")
    config = SchedulerConfig(mode=mode, chunk_size=BUDGET, drop_expired=drop_expired,
                             value_function=value_function)
    predictor = perf_model()
    triage = Triage(get_mode(mode), config, predictor)
    queue = WaitingQueue(predictor, BUDGET)
    for step in range(40):
        now = 0.1 * step
        for i in range(rng.randint(0, 30)):
            request = random_request(rng, 1000 * step + i, now)
            (queue.append if rng.random() < 0.9 else queue.appendleft)(request)
        next_batch_time = rng.choice([0.0, 0.03, 1.0])
        want = reference_triage(mode, config, predictor, list(queue), now, next_batch_time)
        ordered, offloaded, dropped = triage.run(queue, now, lambda: next_batch_time)
        assert (list(ordered), offloaded, dropped) == want
        for request in list(ordered[:rng.randint(0, 3)]):  # offloads and drops have left
            queue.remove(request)
