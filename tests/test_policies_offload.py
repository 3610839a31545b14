"""Offload (paper §5.3): move a waiting LP request to HP exactly when its slack runs short.

Covers: policies/offload.py.
"""
from __future__ import annotations

import pytest

from policies.offload import OffloadDecision, plan_offloads
from policies.predictor import LinearPredictor
from tests.policy_fakes import FakeRequest, names

KEEP, OFFLOAD, UNREACHABLE = OffloadDecision.KEEP, OffloadDecision.OFFLOAD, OffloadDecision.UNREACHABLE
PREDICTOR = LinearPredictor(seconds_per_token=0.001, fixed=0.002)
BUDGET = 512
IPC = 0.01
NEVER = 1e9  # an LP start estimate so late that LP cannot serve the request in time


def own(prompt: int) -> float:
    return PREDICTOR.prefill_time(prompt, 0, BUDGET)


def offload_boundary(prompt: int, threshold: float) -> float:
    """The deadline (now = 0) below which the rule offloads: own + threshold × worst-case HP."""
    worst_hp = PREDICTOR.full_batch_time(BUDGET) + own(prompt) + IPC
    return own(prompt) + threshold * worst_hp


def decide(request, lp_start=NEVER, threshold=1.0, now=0.0):
    """The rule for one request, through what the instance calls: `plan_offloads` on a
    waiting queue of just this request, which LP would start at `lp_start`."""
    offload, hopeless = plan_offloads([request], now, predictor=PREDICTOR, token_budget=BUDGET,
                                      next_batch_time=lp_start - now, threshold=threshold,
                                      ipc_delay=IPC)
    if offload:
        return OFFLOAD
    return UNREACHABLE if hopeless else KEEP


@pytest.mark.parametrize("threshold", [0.5, 1.0, 2.0])
def test_offload_fires_exactly_when_slack_crosses_threshold_times_worst_case_hp(threshold):
    edge = offload_boundary(200, threshold)
    assert decide(FakeRequest("r", 200, deadline=edge + 1e-6), threshold=threshold) is KEEP
    assert decide(FakeRequest("r", 200, deadline=edge - 1e-6), threshold=threshold) is OFFLOAD


def test_the_boundary_moves_with_now():
    edge = offload_boundary(200, 1.0)
    request = FakeRequest("r", 200, deadline=10.0)
    assert decide(request, now=10.0 - edge - 1e-6) is KEEP
    assert decide(request, now=10.0 - edge + 1e-6) is OFFLOAD


def test_keep_when_lp_starts_it_in_time_however_short_the_slack():
    request = FakeRequest("r", 200, deadline=0.5)
    assert decide(request, lp_start=0.5 - own(200)) is KEEP
    assert decide(request, lp_start=0.5 - own(200) + 1e-6) is OFFLOAD


def test_hopeless_when_even_an_idle_hp_cannot_make_the_deadline():
    edge = own(200) + IPC
    assert decide(FakeRequest("r", 200, deadline=edge - 1e-6)) is UNREACHABLE
    assert decide(FakeRequest("r", 200, deadline=edge + 1e-6)) is OFFLOAD
    assert decide(FakeRequest("r", 200, deadline=-1.0)) is UNREACHABLE  # already past


@pytest.mark.parametrize("started", [dict(num_computed_tokens=16), dict(num_preemptions=1)])
def test_never_moves_a_request_whose_prefill_started(started):
    for deadline in (-1.0, 0.3, offload_boundary(200, 1.0) - 1e-6):
        assert decide(FakeRequest("r", 200, deadline=deadline, **started)) is KEEP


def test_no_deadline_means_keep():
    assert decide(FakeRequest("r", 200)) is KEEP


def plan(requests, next_batch_time=0.1, now=0.0):
    offload, hopeless = plan_offloads(requests, now, predictor=PREDICTOR, token_budget=BUDGET,
                                      next_batch_time=next_batch_time, threshold=1.0,
                                      ipc_delay=IPC)
    return names(offload), names(hopeless)


def test_plan_estimates_lp_start_from_the_prefills_ahead():
    each = own(200)
    # LP starts r0 at 0.1, r1 at 0.1 + each, r2 at 0.1 + 2 × each; r2 alone ends late.
    deadline = 0.1 + 3 * each - 1e-6
    requests = [FakeRequest(f"r{i}", 200, deadline=deadline) for i in range(3)]
    assert deadline < offload_boundary(200, 1.0)
    assert plan(requests) == (["r2"], [])
    assert plan(requests, next_batch_time=0.1 - 2e-6) == ([], [])


def test_an_offloaded_request_no_longer_delays_those_behind_it():
    each = own(200)
    urgent = FakeRequest("urgent", 200, deadline=0.1 + each - 1e-6)  # LP is just late: offload
    behind = FakeRequest("behind", 200, deadline=0.1 + each + 1e-6)  # starts at 0.1 once it left
    assert plan([urgent, behind]) == (["urgent"], [])


def test_hopeless_and_started_requests_stay_and_count_as_ahead():
    each = own(200)
    lost = FakeRequest("lost", 200, deadline=0.0)
    started = FakeRequest("started", 200, deadline=0.0, num_computed_tokens=16)
    started_each = PREDICTOR.prefill_time(184, 16, BUDGET)
    follower = FakeRequest("follower", 200, deadline=0.1 + each + started_each + each - 1e-6)
    assert plan([lost, started, follower]) == (["follower"], ["lost"])
    follower.deadline += 2e-6
    assert plan([lost, started, follower]) == ([], ["lost"])
