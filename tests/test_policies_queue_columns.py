"""The per-step policies over a queue's columns decide exactly as the per-request ones.

`value_order`, `offload_candidates` + `offload_rows` and `ttft_lost_rows` are what the
engine runs every step; `order_by_value`, `plan_offloads` and `ttft_unreachable` are the plain
reference. Hypothesis draws queues whose numbers tie and sit on the decision edges
(round token counts, deadlines on a grid, the same arrival times), under a linear
predictor (round numbers) and under the fitted performance model (not round at all).

Covers: policies/queue_columns.py.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from policies.admission import ttft_unreachable  # noqa: E402
from engines.perf.hardware_spec import HARDWARE  # noqa: E402
from engines.perf.model_shape import ModelShape  # noqa: E402
from policies.offload import offload_candidates, offload_rows, plan_offloads  # noqa: E402
from engines.perf.model import PerfModel  # noqa: E402
from policies.predictor import LinearPredictor  # noqa: E402
from policies.queue_columns import QueueColumns, ttft_lost_rows  # noqa: E402
from policies.value import VALUE_FUNCTIONS, VALUE_KEYS, order_by_value, value_order  # noqa: E402
from tests.examples import examples  # noqa: E402
from tests.policy_fakes import FakeRequest  # noqa: E402

BUDGET = 512
LLAMA3_8B = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                       intermediate=14336, vocab=128256)
PREDICTORS = {
    "linear": LinearPredictor(seconds_per_token=0.001, fixed=0.002),
    "perf_model": PerfModel(LLAMA3_8B, HARDWARE["a100"], coeffs=[0.3, 1.2, 0.4, 0.1, 0.004]),
}
SETTINGS = dict(max_examples=examples(150), deadline=None, database=None, derandomize=True)

times = st.one_of(st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0]),
                  st.floats(0.0, 5.0, allow_nan=False))
deadlines = st.one_of(times, st.just(float("inf")))
prompts = st.one_of(st.sampled_from([1, 100, 511, 512, 513, 1000, 2048]), st.integers(1, 3000))


@st.composite
def fake_requests(draw) -> FakeRequest:
    prompt = draw(prompts)
    arrival = draw(st.sampled_from([0.0, 0.1, 0.5]) | st.floats(0.0, 2.0))
    return FakeRequest(f"r{draw(st.integers())}", prompt,
                       deadline=arrival + draw(deadlines), arrival_time=arrival,
                       priority=draw(st.sampled_from([0, 0, 0, 1, 2])),
                       num_computed_tokens=draw(st.sampled_from([0, 0, 0, 50])) % prompt,
                       num_preemptions=draw(st.sampled_from([0, 0, 0, 1])))


queues = st.lists(fake_requests(), max_size=30)


@settings(**SETTINGS)
@given(queue=queues, now=times, predictor=st.sampled_from(sorted(PREDICTORS)),
       value=st.sampled_from(sorted(VALUE_FUNCTIONS)), demote_unreachable=st.booleans(),
       shuffle=st.randoms(use_true_random=False))
def test_value_order_is_order_by_value(queue, now, predictor, value, demote_unreachable, shuffle):
    """Whatever order the sort starts from (`near`: the engine passes the last step's)."""
    predictor = PREDICTORS[predictor]
    want = order_by_value(queue, now, VALUE_FUNCTIONS[value], predictor, BUDGET, demote_unreachable)
    columns = QueueColumns.of(queue, predictor, BUDGET)
    near = np.array(shuffle.sample(range(len(queue)), len(queue)), dtype=np.intp)
    for start in (None, near, near[::-1]):
        order = value_order(columns, now, VALUE_KEYS[value], demote_unreachable, near=start)
        assert [queue[i] for i in order] == want


@settings(**SETTINGS)
@given(queue=queues, now=times, predictor=st.sampled_from(sorted(PREDICTORS)))
def test_ttft_lost_rows_is_ttft_lost(queue, now, predictor):
    predictor = PREDICTORS[predictor]
    columns = QueueColumns.of(queue, predictor, BUDGET)
    assert ttft_lost_rows(columns, now).tolist() == [
        ttft_unreachable(r, now, predictor, BUDGET) for r in queue]


def offloads_by_columns(ordered, now, predictor, next_batch_time, threshold, ipc_delay):
    columns = QueueColumns.of(ordered, predictor, BUDGET)
    order = np.arange(len(ordered))
    full_batch = predictor.full_batch_time(BUDGET)
    candidates = offload_candidates(columns, order, now, full_batch=full_batch,
                                    threshold=threshold, ipc_delay=ipc_delay)
    rows = offload_rows(columns, order, candidates, now, next_batch_time=lambda: next_batch_time,
                        full_batch=full_batch, threshold=threshold, ipc_delay=ipc_delay)
    return [ordered[i] for i in rows]


@settings(**SETTINGS)
@given(queue=queues, now=times, predictor=st.sampled_from(sorted(PREDICTORS)),
       next_batch_time=st.sampled_from([0.0, 0.05, 0.5, 2.0]) | st.floats(0.0, 3.0),
       threshold=st.sampled_from([0.0, 0.5, 1.0, 2.0]), ipc_delay=st.sampled_from([0.0, 0.002]))
def test_offload_rows_are_plan_offloads(queue, now, predictor, next_batch_time, threshold,
                                        ipc_delay):
    predictor = PREDICTORS[predictor]
    ordered = order_by_value(queue, now, VALUE_FUNCTIONS["slack"], predictor, BUDGET, True)
    want, _ = plan_offloads(ordered, now, predictor=predictor, token_budget=BUDGET,
                            next_batch_time=next_batch_time, threshold=threshold,
                            ipc_delay=ipc_delay)
    assert offloads_by_columns(ordered, now, predictor, next_batch_time, threshold,
                               ipc_delay) == want


@pytest.mark.parametrize("seed", range(5))
def test_offload_rows_on_long_queues_add_up_start_times_as_plan_offloads_does(seed):
    """Thousands of unround times: LP's start time is a long running sum, which must be
    added up in the same order (a pairwise sum would differ in the last bits)."""
    rng = random.Random(seed)
    predictor = PREDICTORS["perf_model"]
    queue = [FakeRequest(f"r{i}", rng.randint(1, 4000), arrival_time=(a := rng.uniform(0, 5)),
                         deadline=a + rng.choice([0.5, 2.0, 30.0]),
                         num_preemptions=int(rng.random() < 0.05)) for i in range(3000)]
    now = 5.0
    ordered = order_by_value(queue, now, VALUE_FUNCTIONS["edf"], predictor, BUDGET, True)
    # LP starts the first at `start`: late enough that the queue is partly late
    for start in (0.0, 20.0, 60.0):
        want, _ = plan_offloads(ordered, now, predictor=predictor, token_budget=BUDGET,
                                next_batch_time=start, threshold=2.0, ipc_delay=0.002)
        assert offloads_by_columns(ordered, now, predictor, start, 2.0, 0.002) == want


def test_columns_read_what_the_policies_read():
    started = FakeRequest("started", 300, deadline=2.0, arrival_time=0.5, priority=1,
                          num_computed_tokens=100)
    fresh = FakeRequest("fresh", 700, deadline=float("inf"))
    predictor = PREDICTORS["linear"]
    columns = QueueColumns.of([started, fresh], predictor, BUDGET)
    assert len(columns) == 2
    assert columns.own.tolist() == [predictor.prefill_time(200, 100, BUDGET),
                                    predictor.prefill_time(700, 0, BUDGET)]
    assert columns.deadline.tolist() == [2.0, float("inf")]
    assert columns.arrival.tolist() == [0.5, 0.0]
    assert columns.priority.tolist() == [1, 0]
    assert columns.started.tolist() == [True, False]
    assert columns.position.tolist() == [0, 1]


@pytest.mark.parametrize("predictor", sorted(PREDICTORS))
def test_a_request_due_exactly_when_lp_would_finish_it_stays_and_a_hair_sooner_goes(predictor):
    """Deadlines on the edge of rule 1, to the last bit: LP's running start time must be
    the very float `plan_offloads` adds up, or these flip."""
    predictor = PREDICTORS[predictor]
    rng = random.Random(7)
    queue = [FakeRequest(f"r{i}", rng.randint(1, 3000)) for i in range(400)]
    now, next_batch_time, edge = 1.0, 0.05, []
    lp_start = now + next_batch_time
    for request in queue:
        own = predictor.prefill_time(request.num_uncomputed_tokens, 0, BUDGET)
        edge.append(lp_start + own)  # finishes exactly at its deadline: it stays
        lp_start += own
    for request, due in zip(queue, edge):
        request.deadline = due
    threshold = 1e9  # every request is short of slack: only rule 1 keeps it
    kept, _ = plan_offloads(queue, now, predictor=predictor, token_budget=BUDGET,
                            next_batch_time=next_batch_time, threshold=threshold, ipc_delay=0.0)
    assert kept == []
    assert offloads_by_columns(queue, now, predictor, next_batch_time, threshold, 0.0) == []
    for request in queue[::7]:
        request.deadline = float(np.nextafter(request.deadline, -np.inf))
    want, _ = plan_offloads(queue, now, predictor=predictor, token_budget=BUDGET,
                            next_batch_time=next_batch_time, threshold=threshold, ipc_delay=0.0)
    assert want  # one hair too soon: it goes, and everyone behind it is early
    assert offloads_by_columns(queue, now, predictor, next_batch_time, threshold, 0.0) == want


@pytest.mark.parametrize("predictor", sorted(PREDICTORS))
def test_requests_on_the_hopeless_and_slack_edges_are_decided_as_plan_offloads_does(predictor):
    """Deadlines exactly on rule 2's and rule 3's edges and one float step either side,
    with LP far behind (rule 1 never keeps them)."""
    predictor = PREDICTORS[predictor]
    now, ipc, threshold, late = 3.0, 0.002, 2.0, 1e6
    full_batch = predictor.full_batch_time(BUDGET)
    queue = []
    for i, prompt in enumerate([1, 300, 512, 513, 1999]):
        own = predictor.prefill_time(prompt, 0, BUDGET)
        slack_edge = now + own + threshold * (full_batch + own + ipc)
        for edge in (now + ipc + own, slack_edge):
            for due in (np.nextafter(edge, -np.inf), edge, np.nextafter(edge, np.inf)):
                queue.append(FakeRequest(f"r{i}-{len(queue)}", prompt, deadline=float(due)))
    want, _ = plan_offloads(queue, now, predictor=predictor, token_budget=BUDGET,
                            next_batch_time=late, threshold=threshold, ipc_delay=ipc)
    assert want
    assert offloads_by_columns(queue, now, predictor, late, threshold, ipc) == want
