"""The instance core on its own: commands in, messages out, the step in two halves.

Covers: engines/instance_core.py.
"""
from __future__ import annotations

from engines.instance_core import InstanceCore
from engines.scheduler_config import SchedulerConfig
from ipc.messages import (
    Abort, Finished, FinishReason, Heartbeat, Origin, Ping, RequestError, Role, Shutdown,
    StepOutputs, Submit, Ticket,
)
from ipc.params import SamplingParams
from tests.fakes import FakeExecutor, FakeInstance


def driven(role: Role = Role.HP, mode: str = "hp", **scheduler) -> FakeInstance:
    return FakeInstance(7, role, SchedulerConfig(mode=mode, **scheduler),
                        FakeExecutor(num_kv_blocks=64))


def core(role: Role = Role.HP, mode: str = "hp", **scheduler) -> InstanceCore:
    return driven(role, mode, **scheduler).core


def submit(request_id: str, origin: Origin = Origin.NEW, prompt=(3, 4, 5), max_tokens=2,
           deadline: float = 100.0) -> Submit:
    return Submit(request_id=request_id, prompt_token_ids=list(prompt),
                  sampling=SamplingParams(max_tokens=max_tokens), arrival_time=0.0,
                  deadline=deadline, origin=origin)


def test_an_idle_hp_holds_one_ticket_until_a_new_request_uses_it():
    driver = driven()
    hp = driver.core
    assert hp.ask_for_work() == [Ticket(instance_id=7)]
    assert hp.ask_for_work() == []                       # one at a time
    hp.handle(submit("moved", Origin.OFFLOAD), now=0.5)  # an offload does not use it,
    hp.handle(submit("rescued", Origin.RESCUE), now=0.55)  # nor a rescue
    assert hp.ticket_open
    hp.handle(submit("new"), now=0.6)
    assert not hp.ticket_open
    messages = []
    while hp.has_work:
        messages += driver.step()
    # a step that leaves nothing waiting asks for work: one ticket, held till used
    assert [m for m in messages if isinstance(m, Ticket)] == [Ticket(instance_id=7)]
    assert hp.ticket_open and hp.ask_for_work() == []


def test_a_turn_takes_no_command_after_shutdown_and_an_idle_turn_only_asks_for_work():
    hp = core()
    outputs = hp.take([submit("a"), Shutdown(), submit("b")], now=0.0)
    assert [type(m) for m in outputs] == [Finished] and hp.stopped
    assert "b" not in hp.scheduler.requests
    batch, outputs = core().begin_step(0.0)
    assert not batch and outputs == [Ticket(instance_id=7)]


def test_an_lp_never_asks_for_work():
    assert core(Role.LP, "lp").ask_for_work() == []


def test_a_step_sends_its_tokens_in_one_message_and_every_request_ends_once():
    driver = driven(Role.PEER, "sarathi", chunk_size=64)
    instance = driver.core
    for name in ("a", "b"):
        assert instance.handle(submit(name), now=0.0) == []
    finished = []
    while instance.has_work:
        for message in driver.step():
            assert isinstance(message, StepOutputs) and message.step_seconds == 0.01
            finished += [o.request_id for o in message.tokens.outputs() if o.finish_reason]
    assert sorted(finished) == ["a", "b"] and instance.num_finished == 2


def test_refused_submits_aborts_pings_and_shutdown_each_get_their_answer():
    instance = core(Role.PEER, "sarathi")
    [error] = instance.handle(submit("long", prompt=range(1, 300)), now=0.0)
    assert isinstance(error, RequestError) and "context limit" in error.message
    instance.handle(submit("a"), now=0.0)
    assert instance.handle(Abort(request_id="a"), now=0.1) == [
        Finished(instance_id=7, request_id="a", reason=FinishReason.ABORT)]
    assert instance.handle(Abort(request_id="a"), now=0.2) == []  # answered once
    [beat] = instance.handle(Ping(ping_id=3), now=0.3)
    assert isinstance(beat, Heartbeat) and beat.ping_id == 3
    instance.handle(submit("b"), now=0.4)
    assert instance.handle(Shutdown(), now=0.5) == [
        Finished(instance_id=7, request_id="b", reason=FinishReason.ABORT)]
    assert instance.stopped and not instance.has_work


def test_a_hopeless_request_is_dropped_with_a_finished_message_but_a_pinned_one_is_not():
    driver = driven(Role.LP, "lp", drop_expired=True)
    instance = driver.core
    instance.handle(submit("late", deadline=0.5), now=0.0)
    instance.handle(submit("resumed", Origin.RESUME, deadline=0.5), now=0.0)
    messages = driver.step(now=2.0)
    assert Finished(instance_id=7, request_id="late", reason=FinishReason.DROP) in messages
    assert instance.num_dropped == 1
    assert "resumed" in instance.scheduler.requests
