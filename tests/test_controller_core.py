"""The controller core on its own: events in, actions out -- no socket, clock or loop.

Covers: daemon/core/controller_core.py.
"""
from __future__ import annotations

import msgspec
import pytest

from daemon.core.controller_config import ControllerConfig, SloConfig
from daemon.core.controller_core import ControllerCore
from daemon.core.events import (
    Arrived, ClientLeft, Drain, FromInstance, InstanceDown, Moved, Refuse, Send, SendFailed,
    Settle, StartAccepting, StartTimer, TicketOpened, TimerFired, Tokens,
)
from daemon.core.request_state import IllegalTransition, Outcome, RequestState, Tracked, Trigger
from ipc.api_codes import EndCode, Refusal
from ipc.messages import (
    Abort, Finished, FinishReason, InstanceLoad, Offload, OffloadedRequest, Origin, Ready,
    RequestError, Role,
    StepOutputs, StepTokens, Submit, Ticket, TokenOutput,
)
from ipc.params import SamplingParams

LP0, LP1, HP = 0, 1, 2


def ready(instance_id: int, role: Role, pid: int = 100, max_model_len: int = 64) -> Ready:
    return Ready(instance_id=instance_id, role=role, mode=role.value, executor="sim", pid=pid,
                 num_kv_blocks=100, block_size=16, max_model_len=max_model_len)


def core_2l1h(**config) -> ControllerCore:
    """2L1H with the paper's routing (each request to an instance on arrival) unless
    `global_queue=True` is asked for."""
    config.setdefault("global_queue", False)
    core = ControllerCore({LP0: Role.LP, LP1: Role.LP, HP: Role.HP}, ControllerConfig(**config),
                          SloConfig(ttft_slo=1.0, tbt_slo=0.1))
    for i, role in ((LP0, Role.LP), (LP1, Role.LP), (HP, Role.HP)):
        core.handle(FromInstance(0.0, ready(i, role)))
    core.handle(StartAccepting(0.0))
    return core


def arrive(core, request_id: str, now: float = 1.0, prompt=(5, 6, 7), max_tokens: int = 4):
    return core.handle(Arrived(now, request_id, list(prompt), SamplingParams(max_tokens=max_tokens)))


def sends(actions) -> list[tuple[int, object]]:
    return [(a.instance_id, a.message) for a in actions if isinstance(a, Send)]


def tokens(instance_id: int, *outputs) -> FromInstance:
    return FromInstance(2.0, StepOutputs(instance_id=instance_id, step=1, time=2.0,
                                         step_seconds=0.01, tokens=StepTokens.of(outputs)))


def test_a_new_request_is_sent_with_its_deadline_and_default_slos():
    core = core_2l1h()
    [(target, submit)] = sends(arrive(core, "a", now=3.0))
    assert target in (LP0, LP1) and isinstance(submit, Submit)
    assert (submit.arrival_time, submit.deadline, submit.ttft_slo, submit.tbt_slo) == (3.0, 4.0, 1.0, 0.1)
    assert submit.origin is Origin.NEW
    assert core.ledger.requests["a"].state is RequestState.QUEUED
    assert core.ledger.bounds.requests == 1 and core.ledger.bounds.tokens == 3


def test_tokens_flow_then_the_last_one_settles_it_completed():
    core = core_2l1h()
    [(target, _)] = sends(arrive(core, "a"))
    [first] = core.handle(tokens(target, TokenOutput("a", 9)))
    assert isinstance(first, Tokens) and first.tokens.outputs() == [TokenOutput("a", 9)]
    assert first.ttfts == {0: pytest.approx(1.0)} and first.tbts == []
    assert core.ledger.requests["a"].state is RequestState.STREAMING and core.ledger.bounds.requests == 0
    last, settle = core.handle(tokens(target, TokenOutput("a", 8, FinishReason.LENGTH)))
    assert isinstance(last, Tokens) and (last.ttfts, last.tbts) == ({}, [0.0])
    assert last.tokens.outputs() == [TokenOutput("a", 8, FinishReason.LENGTH)]
    assert settle == Settle("a", Outcome.COMPLETED, None, "", target, 1.0,
                             prompt_tokens=3, instances=(target,), output_tokens=2,
                             ttft=pytest.approx(1.0))
    assert "a" not in core.ledger.requests


def test_one_step_of_tokens_first_middle_last_and_stale_in_order():
    """A step's tokens, whatever mix: a first token (TTFT), a next one (TBT), a last one
    (its Settle after the step's tokens), and one of a request its instance no longer
    holds (not passed on)."""
    core = core_2l1h(routing="round_robin")
    [(lp, _)] = sends(arrive(core, "a"))
    [(other, _)] = sends(arrive(core, "b"))
    core.handle(tokens(lp, TokenOutput("a", 1)))
    step = FromInstance(2.5, StepOutputs(instance_id=lp, step=2, time=2.5, step_seconds=0.01,
                                         tokens=StepTokens.of([TokenOutput("a", 2), TokenOutput("b", 3),
                                                  TokenOutput("a", 4, FinishReason.LENGTH)])))
    passed, settle = core.handle(step)
    assert other != lp  # b's token came from an instance that does not hold it: dropped
    assert passed.tokens.outputs() == [TokenOutput("a", 2), TokenOutput("a", 4, FinishReason.LENGTH)]
    assert (passed.ttfts, passed.tbts) == ({}, [pytest.approx(0.5), 0.0])
    assert isinstance(settle, Settle) and settle.e2e == pytest.approx(1.5)
    assert core.ledger.requests["b"].token_ids == []


def test_a_first_token_after_a_stale_one_keeps_its_ttft_at_its_place_among_those_passed():
    core = core_2l1h(routing="round_robin")
    [(lp, _)] = sends(arrive(core, "a"))
    [(other, _)] = sends(arrive(core, "b"))
    [(again, _)] = sends(arrive(core, "c"))
    assert other != lp == again
    step = FromInstance(2.0, StepOutputs(instance_id=lp, step=1, time=2.0, step_seconds=0.01,
                                         tokens=StepTokens.of([TokenOutput("b", 7),
                                                               TokenOutput("c", 8)])))
    [passed] = core.handle(step)
    assert passed.tokens.outputs() == [TokenOutput("c", 8)]
    assert list(passed.ttfts) == [0] and passed.tbts == []


def test_an_open_hp_ticket_takes_the_next_new_request_only():
    core = core_2l1h()
    assert core.handle(FromInstance(1.0, Ticket(instance_id=HP))) == [TicketOpened(HP)]
    assert core.handle(FromInstance(1.0, Ticket(instance_id=LP0))) == []  # LPs hold none
    [(first, _)] = sends(arrive(core, "a"))
    [(second, _)] = sends(arrive(core, "b"))
    assert first == HP and second != HP


def test_refusals_name_their_reason_and_ask_to_retry():
    core = ControllerCore({0: Role.PEER}, ControllerConfig(max_queued_requests=1))
    [refused] = arrive(core, "early")
    assert isinstance(refused, Refuse) and refused.refusal is Refusal.STARTING
    core.handle(FromInstance(0.0, ready(0, Role.PEER)))
    core.handle(StartAccepting(0.0))
    arrive(core, "a")
    [full] = arrive(core, "b")
    assert full.refusal is Refusal.QUEUE_FULL and "max_queued_requests = 1" in full.message
    assert full.retry_after >= 1 and "b" not in core.ledger.requests


def test_an_offload_moves_to_the_hp_with_the_shortest_queue_prompt_tokens_only():
    core = core_2l1h()
    [(lp, _)] = sends(arrive(core, "a"))
    actions = core.handle(FromInstance(1.5, Offload(instance_id=lp, requests=[
        OffloadedRequest("a", [5, 6, 7])])))
    [(target, submit)] = sends(actions)
    assert target == HP and submit.origin is Origin.OFFLOAD
    assert submit.deadline == 2.0 and submit.prompt_token_ids == [5, 6, 7]
    assert Moved("a", Origin.OFFLOAD, lp, HP) in actions
    assert core.ledger.requests["a"].instance == HP and core.ledger.requests["a"].offloaded
    # The LP's late words about it no longer reach it: only its holder speaks for it.
    assert core.handle(tokens(lp, TokenOutput("a", 1))) == []


def test_an_offload_with_no_hp_up_goes_back_to_an_lp_pinned():
    core = core_2l1h()
    [(lp, _)] = sends(arrive(core, "a"))
    core.handle(InstanceDown(1.2, HP, exit_code=-9))
    actions = core.handle(FromInstance(1.5, Offload(instance_id=lp, requests=[
        OffloadedRequest("a", [5, 6, 7])])))
    [(target, submit)] = sends(actions)
    assert target in (LP0, LP1) and submit.origin is Origin.REROUTE and submit.origin.pinned


def settle_of(actions) -> Settle:
    [settle] = [a for a in actions if isinstance(a, Settle)]
    return settle


def test_a_settle_says_where_it_went_offloaded_and_how_long_it_queued():
    """What a client's serving_info reports: the LP then the HP, offloaded, and the queue
    delay from arrival (1.0) to the start of the step that admitted it on the HP (the
    step ended as received at 2.0 and ran 0.25 s)."""
    core = core_2l1h()
    [(lp, _)] = sends(arrive(core, "a"))
    core.handle(FromInstance(1.5, Offload(instance_id=lp, requests=[
        OffloadedRequest("a", [5, 6, 7])])))
    core.handle(FromInstance(2.0, StepOutputs(instance_id=HP, step=1, time=9.0,
                                              step_seconds=0.25,
                                              tokens=StepTokens.of([TokenOutput("a", 9)]),
                                              admitted=["a"])))
    core.handle(FromInstance(2.5, StepOutputs(instance_id=HP, step=2, time=9.5, step_seconds=0.5,
                                              tokens=StepTokens(), admitted=["a"])))  # first one counts
    settle = settle_of(core.handle(tokens(HP, TokenOutput("a", 8, FinishReason.LENGTH))))
    assert (settle.instances, settle.offloaded, settle.instance) == ((lp, HP), True, HP)
    assert settle.queue_delay == pytest.approx(0.75)


def test_a_request_that_never_started_settles_with_no_queue_delay():
    core = core_2l1h()
    [(lp, _)] = sends(arrive(core, "a"))
    settle = settle_of(core.handle(ClientLeft(1.5, "a")))
    assert (settle.instances, settle.offloaded, settle.queue_delay) == ((lp,), False, None)


def test_a_reroute_counts_as_offloaded_and_a_recovery_adds_its_instance():
    core = core_2l1h()
    [(lp, _)] = sends(arrive(core, "a"))
    core.handle(InstanceDown(1.2, HP, exit_code=-9))
    [(back, _)] = sends(core.handle(FromInstance(1.5, Offload(instance_id=lp, requests=[
        OffloadedRequest("a", [5, 6, 7])]))))
    [(again, _)] = sends(core.handle(InstanceDown(1.6, back, exit_code=-9)))
    settle = settle_of(core.handle(ClientLeft(1.7, "a")))
    assert settle.instances == (lp, back, again) and settle.offloaded


def test_a_dead_instances_requests_are_resubmitted_or_resumed_elsewhere():
    core = core_2l1h()
    [(waiting_on, _)] = sends(arrive(core, "w"))
    core.handle(FromInstance(1.0, Ticket(instance_id=HP)))  # so "s" goes to the HP...
    [(hp, _)] = sends(arrive(core, "s"))
    assert hp == HP
    core.handle(tokens(HP, TokenOutput("s", 11), TokenOutput("s", 12)))
    actions = core.handle(InstanceDown(3.0, HP, exit_code=-9))
    [(target, resumed)] = sends(actions)
    assert target != HP and resumed.origin is Origin.RESUME
    assert resumed.prompt_token_ids == [5, 6, 7, 11, 12] and resumed.sampling.max_tokens == 2
    assert core.ledger.requests["s"].state is RequestState.STREAMING
    assert Moved("s", Origin.RESUME, None, target) in actions
    # "w" did not move: its instance lives. Now its instance dies too.
    actions = core.handle(InstanceDown(3.5, waiting_on, exit_code=1))
    moved = [m for _, m in sends(actions) if m.request_id == "w"]
    assert moved and moved[0].origin is Origin.RESUBMIT and moved[0].prompt_token_ids == [5, 6, 7]


def test_with_no_instance_ready_requests_wait_then_end_at_the_recovery_timeout():
    core = ControllerCore({0: Role.PEER}, ControllerConfig(recovery_timeout=5.0))
    core.handle(FromInstance(0.0, ready(0, Role.PEER, pid=1)))
    core.handle(StartAccepting(0.0))
    arrive(core, "a")
    actions = core.handle(InstanceDown(2.0, 0, exit_code=-9))
    [timer] = [a for a in actions if isinstance(a, StartTimer)]
    assert timer.at == 7.0 and core.ledger.requests["a"].state is RequestState.MOVING
    [settle] = core.handle(TimerFired(7.0, timer.timer))
    assert settle.outcome is Outcome.ERRORED and settle.code is EndCode.INSTANCE_FAILED
    assert "within 5 s" in settle.message and "instance 0 stopped" in settle.message


def test_a_restarted_instance_takes_back_what_waited_for_it():
    core = ControllerCore({0: Role.PEER}, ControllerConfig(recovery_timeout=5.0))
    core.handle(FromInstance(0.0, ready(0, Role.PEER, pid=1)))
    core.handle(StartAccepting(0.0))
    arrive(core, "a")
    core.handle(InstanceDown(2.0, 0, exit_code=-9))
    actions = core.handle(FromInstance(3.0, ready(0, Role.PEER, pid=2)))
    [(target, submit)] = sends(actions)
    assert target == 0 and submit.origin is Origin.RESUBMIT
    assert core.ledger.requests["a"].state is RequestState.QUEUED and core.ledger.requests["a"].num_recoveries == 1


def test_a_client_that_leaves_ends_its_request_and_aborts_it_on_its_instance():
    core = core_2l1h()
    [(target, _)] = sends(arrive(core, "a"))
    actions = core.handle(ClientLeft(1.5, "a"))
    assert actions == [Settle("a", Outcome.CANCELLED, None, "", target, None, prompt_tokens=3,
                              instances=(target,)),
                       Send(target, Abort(request_id="a"))]
    assert core.ledger.bounds.requests == 0
    assert core.handle(ClientLeft(1.6, "a")) == []  # once only


def test_drops_and_refusals_from_instances_end_the_request_with_their_reason():
    core = core_2l1h()
    [(a_on, _)] = sends(arrive(core, "a"))
    [(b_on, _)] = sends(arrive(core, "b"))
    [dropped] = core.handle(FromInstance(2.0, Finished(instance_id=a_on, request_id="a",
                                                       reason=FinishReason.DROP)))
    assert dropped.outcome is Outcome.DROPPED and dropped.code is EndCode.TTFT_SLO_MISSED
    [rejected] = core.handle(FromInstance(2.0, RequestError(instance_id=b_on, request_id="b",
                                                            message="prompt too long")))
    assert rejected.outcome is Outcome.REJECTED and rejected.message == "prompt too long"


def test_an_unreachable_instance_is_treated_as_dead_for_what_was_sent_to_it():
    core = core_2l1h()
    [(target, submit)] = sends(arrive(core, "a"))
    actions = core.handle(SendFailed(1.1, target, submit, unreachable=True))
    [(elsewhere, moved)] = sends(actions)
    assert moved.request_id == "a" and moved.origin is Origin.RESUBMIT
    [failed] = core.handle(SendFailed(1.2, elsewhere, moved, unreachable=False))
    assert failed.outcome is Outcome.ERRORED and failed.code is EndCode.INTERNAL


def test_drain_refuses_new_requests_and_ends_the_rest_at_its_timeout():
    core = core_2l1h()
    arrive(core, "a")
    [timer] = core.handle(Drain(5.0, timeout=2.0))
    [refused] = arrive(core, "b", now=5.5)
    assert refused.refusal is Refusal.SHUTTING_DOWN
    [settle] = core.handle(TimerFired(7.0, timer.timer))
    assert settle.code is EndCode.SHUTTING_DOWN and "2 s" in settle.message
    assert not core.ledger.requests


def test_messages_from_an_instance_that_is_not_ready_reach_no_request():
    core = core_2l1h()
    [(target, _)] = sends(arrive(core, "a"))
    core.handle(InstanceDown(2.0, target, exit_code=-9))
    assert core.handle(tokens(target, TokenOutput("a", 1, FinishReason.STOP))) == []


def test_the_state_table_refuses_an_illegal_move_before_changing_anything():
    submit = Submit(request_id="r", prompt_token_ids=[1], sampling=SamplingParams(),
                    arrival_time=0.0)
    tracked = Tracked("r", 0.0, submit, submit)
    tracked.advance(Trigger.ENDED)
    with pytest.raises(IllegalTransition, match="done"):
        tracked.advance(Trigger.FIRST_TOKEN)
    assert tracked.state is RequestState.DONE


def test_not_an_event_is_misuse():
    with pytest.raises(TypeError):
        core_2l1h().handle("hello")
    with pytest.raises(ValueError, match="duplicate"):
        core = core_2l1h()
        arrive(core, "a")
        arrive(core, "a")


# ---- the global queue (late binding) -----------------------------------------------------
#: An instance's model: 1 ms per prompt token; a step runs 100 tokens -> bound = 0.2 s.
CURVE = [(16, 0.016), (65536, 65.536)]


def core_late(**config) -> ControllerCore:
    core = ControllerCore({LP0: Role.LP, LP1: Role.LP, HP: Role.HP},
                          ControllerConfig(global_queue=True, **config),
                          SloConfig(ttft_slo=1.0, tbt_slo=0.1))
    for i, role in ((LP0, Role.LP), (LP1, Role.LP), (HP, Role.HP)):
        ready_message = msgspec.structs.replace(ready(i, role, max_model_len=4096),
                                                prefill_curve=CURVE, token_budget=100)
        core.handle(FromInstance(0.0, ready_message))
    core.handle(StartAccepting(0.0))
    return core


def report(core, instance_id: int, now: float, accepted: int, queued_seconds: float):
    return core.handle(FromInstance(now, StepOutputs(
        instance_id=instance_id, step=1, time=now, step_seconds=0.01, tokens=StepTokens(),
        load=InstanceLoad(accepted, round(queued_seconds * 1000), queued_seconds, 0))))


def test_a_burst_waits_at_the_controller_and_lps_take_it_as_they_free_up():
    core = core_late()
    sent = []
    for i in range(8):  # 8 x 100 tokens = 0.1 s each; each LP takes two (bound 0.2 s)
        sent += sends(arrive(core, f"r{i}", now=1.0, prompt=[5] * 100))
    assert sorted(target for target, _ in sent) == [LP0, LP0, LP1, LP1]
    assert sum(t.state is RequestState.PENDING for t in core.ledger.requests.values()) == 4
    # LP0 took both in and has one left (0.1 s): it takes one more, LP1 stays full
    later = sends(report(core, LP0, 1.1, accepted=2, queued_seconds=0.1))
    assert [target for target, _ in later] == [LP0]
    assert later[0][1].request_id == "r4"  # in deadline order: the oldest first


def test_a_request_the_lps_cannot_serve_in_time_is_rescued_by_the_hp_at_once():
    core = core_late()
    report(core, LP0, 0.5, accepted=0, queued_seconds=5.0)  # both LPs 5 s behind
    report(core, LP1, 0.5, accepted=0, queued_seconds=5.0)
    actions = arrive(core, "urgent", now=1.0, prompt=[5] * 100)
    [(target, submit)] = sends(actions)
    assert target == HP and submit.origin is Origin.RESCUE  # the controller's, not an LP's offload
    assert Moved("urgent", Origin.RESCUE, None, HP) in actions and core.ledger.requests["urgent"].offloaded


def test_with_drop_a_request_no_instance_can_serve_in_time_ends_at_once():
    core = core_late(shed="drop")
    for i in (LP0, LP1, HP):
        report(core, i, 0.5, accepted=0, queued_seconds=5.0)
    [settle] = [a for a in arrive(core, "late", now=1.0, prompt=[5] * 100) if isinstance(a, Settle)]
    assert settle.outcome is Outcome.DROPPED and settle.code is EndCode.TTFT_SLO_MISSED
    assert "predicted to miss" in settle.message and not core.ledger.requests
    assert settle.retry_after == 1  # a 503 with Retry-After: about one TTFT target


def measured_at(core, instance_id: int, now: float, prefill_rate: float):
    """An idle instance reports the prefill rate it measured (decodes sharing its steps)."""
    return core.handle(FromInstance(now, StepOutputs(
        instance_id=instance_id, step=1, time=now, step_seconds=0.01, tokens=StepTokens(),
        load=InstanceLoad(0, 0, 0.0, 0, prefill_rate=prefill_rate))))


def where_it_went(actions) -> tuple[int | None, Origin | None, Outcome | None]:
    """The one request's target and origin if it was sent, its outcome if it ended."""
    settles = [a.outcome for a in actions if isinstance(a, Settle)]
    sent = sends(actions)
    assert len(sent) + len(settles) == 1
    return (sent[0][0], sent[0][1].origin, None) if sent else (None, None, settles[0])


@pytest.mark.parametrize("tokens, bound", [(800, True), (1000, False)])
def test_a_long_prompt_an_lp_runs_whole_in_time_is_bound_not_shed(tokens, bound):
    """Every instance measured at half its model's rate (decodes share its steps): in
    chunks 800 tokens take 1.6 s, past the 1 s TTFT target; whole, at the model's rate
    1.2 times slower, 0.96 s, which an LP does when only that meets the target
    (`WaitingRoom.lp_prompt_rate`). 1,000 tokens take 1.2 s even whole (1.1 s on the
    HP, rescuing it whole): shed."""
    core = core_late(shed="drop")
    for i in (LP0, LP1, HP):
        measured_at(core, i, 0.5, prefill_rate=500.0)
    target, origin, outcome = where_it_went(arrive(core, "long", now=1.0, prompt=[5] * tokens))
    if bound:
        assert target in (LP0, LP1) and origin is not Origin.RESCUE
    else:
        assert outcome is Outcome.DROPPED


@pytest.mark.parametrize("tokens, rescued", [(850, True), (950, False)])
def test_a_long_prompt_an_hp_runs_whole_in_time_is_rescued_not_shed(tokens, rescued):
    """Both LPs 5 s behind; the HP idle but measured at half its model's rate: in chunks
    850 tokens take 1.7 s there, past the 1 s TTFT target; whole, at the model's rate 1.1
    times slower, 0.94 s, which an HP does when only that meets the target
    (`HP_WHOLE_PREFILL_SLOWDOWN`). 950 tokens take 1.05 s even whole: shed."""
    core = core_late(shed="drop")
    for i in (LP0, LP1):
        report(core, i, 0.5, accepted=0, queued_seconds=5.0)
    measured_at(core, HP, 0.5, prefill_rate=500.0)
    target, origin, outcome = where_it_went(arrive(core, "long", now=1.0, prompt=[5] * tokens))
    if rescued:
        assert target == HP and origin is Origin.RESCUE
    else:
        assert outcome is Outcome.DROPPED


def test_a_miss_budget_of_zero_demotes_what_drop_would_end():
    core = core_late(shed="drop", miss_budget=0.0)
    for i in (LP0, LP1, HP):
        report(core, i, 0.5, accepted=0, queued_seconds=5.0)
    actions = arrive(core, "late", now=1.0, prompt=[5] * 100)
    assert not [a for a in actions if isinstance(a, Settle)]
    assert core.ledger.requests["late"].state in (RequestState.PENDING, RequestState.QUEUED)


def test_with_demote_it_waits_behind_the_feasible_ones_and_never_for_ever():
    core = core_late(shed="demote", max_wait_slo_multiple=3.0)
    for i in (LP0, LP1, HP):
        report(core, i, 0.5, accepted=0, queued_seconds=5.0)
    actions = arrive(core, "late", now=1.0, prompt=[5] * 100)
    assert sends(actions) == []
    assert core.ledger.requests["late"].state is RequestState.PENDING
    [timer] = [a.timer for a in actions if isinstance(a, StartTimer)]   # the overdue watch
    early = core.handle(TimerFired(3.5, timer))   # 2.5 s, and 2.75 s at the next look
    assert not any(isinstance(a, Settle) for a in early)
    assert core.ledger.requests["late"].state is RequestState.PENDING
    [again] = [a.timer for a in early if isinstance(a, StartTimer)]
    actions = core.handle(TimerFired(3.9, again))  # 3.15 s at the next look > 3 x its 1 s SLO
    [settle] = [a for a in actions if isinstance(a, Settle)]
    assert settle.outcome is Outcome.DROPPED and "waited 2.9 s" in settle.message
    assert sends(actions) == []   # no instance held it: nothing to abort


def test_a_request_an_instance_holds_past_its_longest_wait_ends_and_is_aborted_there():
    core = core_late(max_wait_slo_multiple=3.0)
    actions = arrive(core, "stuck", now=1.0, prompt=[5] * 100)
    [(lp, _)] = sends(actions)
    [timer] = [a for a in actions if isinstance(a, StartTimer)]   # the overdue watch
    assert timer.at == pytest.approx(1.25)
    early = core.handle(TimerFired(3.5, timer.timer))   # 2.5 s: before the next look, 2.75
    assert not any(isinstance(a, Settle) for a in early)
    [again] = [a for a in early if isinstance(a, StartTimer)]
    actions = core.handle(TimerFired(3.9, again.timer))  # by the next look it would be 3.15 s
    [settle] = [a for a in actions if isinstance(a, Settle)]
    assert settle.outcome is Outcome.DROPPED and "for its first token" in settle.message
    assert (lp, Abort(request_id="stuck")) in sends(actions)
    assert "stuck" not in core.ledger.requests
    assert not [a for a in actions if isinstance(a, StartTimer)]   # nothing left to watch


def test_an_offload_no_hp_can_finish_in_time_waits_at_the_controller_again():
    core = core_late(shed="demote")  # (with "drop" it would end at once: nowhere in time)
    [(lp, _)] = sends(arrive(core, "a", now=1.0, prompt=[5] * 100))
    report(core, HP, 1.1, accepted=0, queued_seconds=9.0)   # the HP is far behind
    report(core, LP0, 1.1, accepted=1, queued_seconds=5.0)  # and so are the LPs
    report(core, LP1, 1.1, accepted=0, queued_seconds=5.0)
    actions = core.handle(FromInstance(1.2, Offload(instance_id=lp, requests=[
        OffloadedRequest("a", [5] * 100)])))
    assert sends(actions) == [] and core.ledger.requests["a"].state is RequestState.PENDING


def test_a_pending_request_whose_client_leaves_ends_without_an_abort():
    core = core_late()
    for i in (LP0, LP1):  # busy past the bound, but in time for it: it waits for them
        report(core, i, 0.5, accepted=0, queued_seconds=0.5)
    arrive(core, "a", now=1.0, prompt=[5] * 100)
    assert core.ledger.requests["a"].state is RequestState.PENDING
    assert core.handle(ClientLeft(1.5, "a")) == [Settle("a", Outcome.CANCELLED, None, "", None, None,
                                                              prompt_tokens=100)]
    assert core.ledger.bounds.requests == 0 and not len(core.room)


def test_an_hp_ticket_takes_a_new_request_before_lps_with_room_do():
    core = core_late()
    for i in (LP0, LP1):
        report(core, i, 0.5, accepted=0, queued_seconds=0.0)
    assert core.handle(FromInstance(0.6, Ticket(instance_id=HP))) == [TicketOpened(HP)]
    [(target, submit)] = sends(arrive(core, "a", now=1.0, prompt=[5] * 100))
    assert target == HP and submit.origin is Origin.NEW
    [(target, _)] = sends(arrive(core, "b", now=1.1, prompt=[5] * 100))
    assert target in (LP0, LP1)  # the ticket is spent


def test_an_hp_ticket_takes_the_head_of_what_waits_when_the_lps_are_full():
    core = core_late()
    for i in (LP0, LP1):
        report(core, i, 0.5, accepted=0, queued_seconds=0.5)
    assert sends(arrive(core, "a", now=1.0, prompt=[5] * 100)) == []
    [(target, submit)] = sends(core.handle(FromInstance(1.1, Ticket(instance_id=HP))))
    assert target == HP and submit.request_id == "a" and submit.origin is Origin.NEW
