"""The controller core's role switching for `<n>A` layouts (daemon/core/role_switch.py): a
change is sent, nothing is bound to the instance meanwhile, its answer moves the books and
the requests it gave back wait again -- none lost.

Covers: daemon/core/role_switch.py.
"""
from __future__ import annotations

import msgspec
import pytest

from daemon.core.controller_config import ControllerConfig, SloConfig
from daemon.core.controller_core import ControllerCore
from daemon.core.events import Arrived, FromInstance, RoleSwitched, Send, Settle, StartAccepting
from daemon.core.request_state import RequestState
from ipc.messages import (
    InstanceLoad, OffloadedRequest, Origin, Role, RoleChanged, SetRole, StepOutputs, StepTokens, Submit,
    Ticket,
)
from ipc.params import SamplingParams
from policies.roles import FAIR_BURST_HP_SHARE
from tests.test_controller_core import CURVE, ready


def core_3a(hps_in_bursts: bool = ControllerConfig().hps_in_bursts,
            class_floor: float = 0.0) -> ControllerCore:
    core = ControllerCore({0: Role.LP, 1: Role.LP, 2: Role.LP},
                          ControllerConfig(global_queue=True, hps_in_bursts=hps_in_bursts,
                                           class_floor=class_floor),
                          SloConfig(ttft_slo=1.0, tbt_slo=0.1), dynamic_roles=True)
    for i in range(3):
        core.handle(FromInstance(0.0, msgspec.structs.replace(
            ready(i, Role.LP, max_model_len=4096), prefill_curve=CURVE, token_budget=100)))
    core.handle(StartAccepting(0.0))
    return core


def arrive(core, request_id, now, ttft_slo=None, prompt_len=100):
    return core.handle(Arrived(now, request_id, [5] * prompt_len, SamplingParams(max_tokens=4),
                               ttft_slo=ttft_slo))


def submits(actions) -> list[tuple[int, Submit]]:
    return [(a.instance_id, a.message) for a in actions
            if isinstance(a, Send) and isinstance(a.message, Submit)]


def changed(core, i, role, now, returned=()):
    return core.handle(FromInstance(now, RoleChanged(
        instance_id=i, role=role, mode=role.value,
        returned=[OffloadedRequest(r, [5] * 100) for r in returned])))


def test_static_layouts_have_no_role_switching():
    assert ControllerCore({0: Role.LP, 1: Role.HP}).roles is None
    assert ControllerCore({0: Role.LP, 1: Role.LP}, ControllerConfig(global_queue=False),
                          dynamic_roles=True).roles is None


def test_a_switching_instance_gets_nothing_and_its_given_back_requests_bind_again():
    core = core_3a()
    sent = []
    for k in range(4):  # 100 tokens = 0.1 s each; each LP takes two (bound 0.2 s)
        sent += submits(arrive(core, f"r{k}", now=1.0))
    on_zero = [s.request_id for target, s in sent if target == 0]
    assert len(on_zero) == 2
    out = []
    core.roles.switch(0, Role.HP, "test", out)
    assert out == [Send(0, SetRole(role=Role.HP, mode="hp"))] and 0 in core.ledger.switching
    # while the change is under way, new requests go elsewhere
    for k in range(4, 8):
        assert all(target != 0 for target, _ in submits(arrive(core, f"r{k}", now=1.01)))
    # it changed, giving back one request that had not started; the other started there
    actions = changed(core, 0, Role.HP, 1.2, returned=[on_zero[1]])
    [switched] = [a for a in actions if isinstance(a, RoleSwitched)]
    assert (switched.old, switched.new, switched.reason, switched.returned) == (
        Role.LP, Role.HP, "test", 1)
    assert core.ledger.role_of[0] is Role.HP and core.ledger.instances[0].role is Role.HP
    assert core.router.hp_ids == [0] and core.router.pool == [1, 2]
    assert 0 not in core.ledger.switching and core.roles.since[0] == 1.2
    back = core.ledger.requests[on_zero[1]]
    assert back.instance != 0 and not back.requeued
    assert back.state in (RequestState.PENDING, RequestState.QUEUED)
    if back.state is RequestState.QUEUED:  # bound again at once: as a new request or rescue
        assert back.submit.origin in (Origin.NEW, Origin.RESCUE)
    # every request is still tracked: none lost, none ended
    assert len(core.ledger.requests) == 8
    assert not any(isinstance(a, Settle) for a in actions)


def test_the_answer_carries_the_backlog_left_once_the_returned_requests_are_gone():
    core = core_3a()
    for k in range(2):
        arrive(core, f"r{k}", now=1.0)
    assert core.room.backlog_tokens(0) > 0
    core.roles.switch(0, Role.HP, "test", [])
    core.handle(FromInstance(1.1, RoleChanged(instance_id=0, role=Role.HP, mode="hp",
                                              load=InstanceLoad(2, 0, 0.0, 0))))
    assert core.room.backlog_tokens(0) == 0


def test_an_hp_leaving_gives_up_its_ticket_at_once_and_a_restart_resets_its_role():
    core = core_3a()
    core.roles.switch(2, Role.HP, "test", [])
    changed(core, 2, Role.HP, 1.0)
    core.handle(FromInstance(1.1, Ticket(instance_id=2)))
    assert core.router.tickets.is_open(2)
    core.roles.switch(2, Role.LP, "test", [])
    assert not core.router.tickets.is_open(2)
    core.handle(FromInstance(1.2, Ticket(instance_id=2)))  # sent before it changed
    assert not core.router.tickets.is_open(2)
    # it died mid-change and came back as it started: an LP, nothing under way
    core.handle(FromInstance(2.0, msgspec.structs.replace(
        ready(2, Role.LP, max_model_len=4096), prefill_curve=CURVE, token_budget=100)))
    assert core.ledger.role_of[2] is Role.LP and not core.roles.pending
    assert 2 not in core.ledger.switching and core.router.hp_ids == []


def test_a_change_the_instance_refused_keeps_its_role():
    core = core_3a()
    core.roles.switch(1, Role.HP, "test", [])
    actions = changed(core, 1, Role.LP, 1.0)
    assert not any(isinstance(a, RoleSwitched) for a in actions)
    assert core.ledger.role_of[1] is Role.LP and not core.ledger.switching


def test_the_policy_adds_an_hp_for_a_tight_class_once_a_window_shows_rescuable_requests():
    core = core_3a()
    out = []
    for k in range(60):  # a mixed-SLO stream: one in three is tight
        now = 0.2 * k
        out += arrive(core, f"r{k}", now, ttft_slo=0.5 if k % 3 == 0 else 2.0)
        core.roles.evidence.set_aside(now, [], 1 if k % 10 == 0 else 0)
    set_roles = [a for a in out if isinstance(a, Send) and isinstance(a.message, SetRole)]
    assert len(set_roles) == 1 and set_roles[0].message.role is Role.HP
    assert core.roles.pending and set_roles[0].instance_id in core.ledger.switching
    # one change at a time: nothing more while it is under way
    later = arrive(core, "more", 12.5, ttft_slo=0.5)
    assert not any(isinstance(a, Send) and isinstance(a.message, SetRole) for a in later)


def test_uniform_slos_keep_every_instance_an_lp():
    core = core_3a()
    out = []
    for k in range(100):
        out += arrive(core, f"r{k}", 0.2 * k)
        core.roles.evidence.set_aside(0.2 * k, [], 1)
    assert not any(isinstance(a, Send) and isinstance(a.message, SetRole) for a in out)
    assert all(r is Role.LP for r in core.ledger.role_of.values())


@pytest.mark.parametrize("hps_in_bursts", [False, True])
def test_uniform_slos_arriving_in_bursts_add_an_hp_unless_turned_off(hps_in_bursts):
    """The same requests and late ones as above, but in bursts of 25 within 50 ms, one
    burst every 5 s: the core's evidence reads bursts, and with `hps_in_bursts` the
    policy adds an HP (for the longest prompts' floor); without it it does not."""
    core = core_3a(hps_in_bursts)
    out = []
    for k in range(100):
        now = 5.0 * (k // 25) + 0.002 * (k % 25)
        out += arrive(core, f"r{k}", now)
        core.roles.evidence.set_aside(now, [], 1)
    out += core.handle(Arrived(20.5, "late", [5] * 100, SamplingParams(max_tokens=4)))
    set_roles = [a for a in out if isinstance(a, Send) and isinstance(a.message, SetRole)]
    assert [a.message.role for a in set_roles] == ([Role.HP] if hps_in_bursts else [])
    if hps_in_bursts:
        assert "bursts" in core.roles.pending[set_roles[0].instance_id][1]


def test_a_class_floor_gives_way_to_hps_while_arrivals_come_in_bursts():
    """Under a class floor the core tells the waiting room when arrivals come in bursts
    (no class is protected then) and lets bursts take two HPs of three, not one."""
    core = core_3a(class_floor=0.8)
    classes = core.room.classes
    assert core.roles.params.burst_hp_share == FAIR_BURST_HP_SHARE
    assert core_3a().roles.params.burst_hp_share < FAIR_BURST_HP_SHARE
    for k in range(100):  # steady: one every 0.2 s
        arrive(core, f"s{k}", 0.2 * k)
    assert not classes.in_bursts
    for k in range(100):  # then bursts of 25 within 50 ms, one every 5 s
        arrive(core, f"b{k}", 20.0 + 5.0 * (k // 25) + 0.002 * (k % 25))
    arrive(core, "late", 40.5)
    assert classes.in_bursts


def test_steps_report_load_while_switching_without_binding_there():
    core = core_3a()
    core.roles.switch(0, Role.HP, "test", [])
    actions = core.handle(FromInstance(1.0, StepOutputs(
        instance_id=0, step=1, time=1.0, step_seconds=0.01, tokens=StepTokens(),
        load=InstanceLoad(0, 0, 0.0, 0))))
    assert all(target != 0 for target, _ in submits(actions))
