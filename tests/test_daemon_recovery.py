"""The pure parts of fault handling: recovery plans (daemon/core/recovery_plan.py), the
admission bounds (daemon/core/admission_bounds.py), and what a resumed request means to an
instance.

Covers: daemon/core/recovery_plan.py, daemon/core/admission_bounds.py.
"""
from __future__ import annotations

import math

from daemon.core.admission_bounds import AdmissionBounds, retry_after
from daemon.core.recovery_plan import recover, recovery_target, reroute_offload, resume_submit
from engines.offline import Offline
from engines.request import Request
from engines.scheduler_config import SchedulerConfig
from ipc.messages import Origin, Role, Submit
from ipc.params import SamplingParams
from policies.admission import should_drop, ttft_unreachable
from policies.offload import plan_offloads
from policies.predictor import LinearPredictor, ZeroPredictor
from tests.fakes import FakeExecutor, expected_output


def submit(prompt=(5, 6, 7), max_tokens=10, **fields) -> Submit:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.7, seed=42, top_k=5,
                              stop_token_ids=[3])
    return Submit(request_id="r1", prompt_token_ids=list(prompt), sampling=sampling,
                  arrival_time=100.0, deadline=101.0, ttft_slo=1.0, tbt_slo=0.1, priority=2,
                  **fields)


# ---- recovery plans ---------------------------------------------------------------------

def test_a_request_without_a_first_token_is_resubmitted_unchanged_as_an_offload():
    plan = recover(submit(), [], max_model_len=64)
    assert plan.kind is Origin.RESUBMIT and plan.error is None
    assert plan.submit == submit(origin=Origin.RESUBMIT)  # same prompt, arrival, deadline, ...
    assert not plan.submit.origin.pinned  # it may still be offloaded or dropped


def test_a_request_mid_decode_resumes_with_its_output_in_the_prompt():
    plan = recover(submit(), [9, 8, 7, 6], max_model_len=64)
    assert plan.kind is Origin.RESUME and plan.error is None
    new = plan.submit
    assert new.prompt_token_ids == [5, 6, 7, 9, 8, 7, 6]
    assert new.sampling.max_tokens == 6 and new.origin.pinned
    assert new.generated_before == 4  # penalties still count the output so far
    # Everything else travels unchanged: id, arrival and deadline, SLOs, priority, and the
    # sampling fields (the seed too: see the module docstring).
    old = submit()
    assert (new.request_id, new.arrival_time, new.deadline, new.ttft_slo, new.tbt_slo,
            new.priority) == (old.request_id, old.arrival_time, old.deadline, old.ttft_slo,
                              old.tbt_slo, old.priority)
    assert (new.sampling.temperature, new.sampling.seed, new.sampling.top_k,
            new.sampling.stop_token_ids) == (0.7, 42, 5, [3])


def test_a_resume_that_does_not_fit_the_context_ends_with_a_clear_error():
    plan = recover(submit(max_tokens=100), list(range(10, 70)), max_model_len=63)
    assert plan.submit is None and "63" in plan.error and "cannot be resumed" in plan.error
    assert recover(submit(max_tokens=100), list(range(10, 70)), max_model_len=64).submit


def test_nothing_left_to_generate_means_nothing_to_resume():
    assert resume_submit(submit(max_tokens=3), [1, 2, 3]) is None
    assert recover(submit(max_tokens=3), [1, 2, 3], 64).error


def test_an_offload_no_hp_can_take_stays_where_it_lands():
    moved = reroute_offload(submit())
    assert moved.origin is Origin.REROUTE and moved.origin.pinned
    assert moved.prompt_token_ids == [5, 6, 7]


def test_targets_go_where_offloads_go_then_to_the_least_loaded():
    roles = {0: Role.LP, 1: Role.LP, 2: Role.HP, 3: Role.HP}
    queued = {0: 5, 1: 0, 2: 4, 3: 2}
    in_flight = {0: 9, 1: 1, 2: 6, 3: 7}
    assert recovery_target([0, 1, 2, 3], roles, queued, in_flight) == 3  # the HP with least waiting
    assert recovery_target([0, 1, 2], roles, queued, in_flight) == 2     # 3 is not ready
    assert recovery_target([0, 1], roles, queued, in_flight) == 1       # no HP up: least loaded
    assert recovery_target([0], roles, queued, in_flight) == 0
    assert recovery_target([], roles, queued, in_flight) is None
    peers = {0: Role.PEER, 1: Role.PEER, 2: Role.PEER}
    assert recovery_target([0, 1, 2], peers, {}, {0: 3, 1: 2, 2: 2}) == 1


# ---- resumed requests in an instance ------------------------------------------------------

def test_a_resumed_request_continues_exactly_where_it_stopped():
    """Recompute continuity on one instance: the output of (prompt + first k tokens) with
    max_tokens - k equals the rest of an uninterrupted greedy run, for every k."""
    prompt, max_tokens = [3, 1, 4, 1, 5, 9, 2, 6], 12
    full = expected_output(prompt, max_tokens)
    for k in (1, 5, 11):
        offline = Offline(FakeExecutor(), SchedulerConfig(mode="sarathi", chunk_size=8))
        resumed = resume_submit(Submit(request_id="r", prompt_token_ids=prompt,
                                       sampling=SamplingParams(max_tokens=max_tokens),
                                       arrival_time=0.0), full[:k])
        [done] = offline.generate([resumed.prompt_token_ids], resumed.sampling)
        assert full[:k] + done.token_ids == full


def test_a_resumed_request_is_never_dropped_offloaded_or_demoted():
    sampling = SamplingParams(max_tokens=4)
    fresh = Request("a", list(range(1, 50)), sampling, arrival_time=0.0, deadline=1.0)
    resumed = Request("b", list(range(1, 50)), sampling, arrival_time=0.0, deadline=1.0,
                      pinned=True)
    now, predictor = 5.0, ZeroPredictor()  # long past both deadlines
    assert should_drop(fresh, now, predictor=predictor, token_budget=8, drop_expired=True)
    assert should_drop(resumed, now, predictor=predictor, token_budget=8, drop_expired=True) is False
    assert ttft_unreachable(fresh, now, predictor, 8) and not ttft_unreachable(resumed, now, predictor, 8)
    slow = LinearPredictor(seconds_per_token=0.01)  # a busy LP: it starts them in 10 s
    offload, _ = plan_offloads([fresh, resumed], 0.3, predictor=slow, token_budget=8,
                               next_batch_time=10.0)
    assert offload == [fresh]


# ---- the admission bounds ----------------------------------------------------------------

def test_the_admission_bounds_refuse_past_either_limit():
    bounds = AdmissionBounds(max_requests=2, max_tokens=100)
    assert bounds.refusal(60) is None
    bounds.add(60)
    refusal = bounds.refusal(41)
    assert "max_queued_tokens = 100" in refusal and "41" in refusal
    assert bounds.refusal(40) is None
    bounds.add(40)
    assert "max_queued_requests = 2" in bounds.refusal(1)
    bounds.remove(60)
    assert bounds.refusal(60) is None and (bounds.requests, bounds.tokens) == (1, 40)
    bounds.remove(40)
    bounds.remove(40)  # never below zero
    assert (bounds.requests, bounds.tokens) == (0, 0)


def test_retry_after_is_about_one_ttft_target_and_at_least_a_second():
    assert retry_after(0.2) == 1 and retry_after(1.0) == 1 and retry_after(2.5) == 3
    assert isinstance(retry_after(math.pi), int)
