"""An instance changing role (`SetRole`, `<n>A` layouts): the instance core swaps its
scheduler's mode at the step boundary and gives back its waiting requests.

Covers: engines/instance_core.py.
"""
from __future__ import annotations

from bench.sim.sim_instances import SimConfig, SimInstance, build_instance
from ipc.messages import Origin, Role, RoleChanged, SetRole, StepOutputs, Submit, Ticket
from ipc.params import SamplingParams

from tests.test_instance_core import core as fake_core


def lp() -> SimInstance:
    """An LP over the simulated A100 (it has a performance model, as lp and hp modes do)."""
    return build_instance(SimConfig(layout_modes=("lp",)), 0, "lp")


def submit(request_id: str, prompt_len: int = 3000, origin: Origin = Origin.NEW) -> Submit:
    return Submit(request_id=request_id, prompt_token_ids=[5] * prompt_len,
                  sampling=SamplingParams(max_tokens=4, ignore_eos=True), arrival_time=0.0,
                  deadline=100.0, origin=origin)


def step(sim: SimInstance, now: float):
    batch, outputs = sim.core.begin_step(now)
    if not batch:
        return outputs
    return sim.core.finish_step(batch, sim.executor.tokens(batch), 0.05, now)


def test_lp_to_hp_gives_back_waiting_requests_and_keeps_the_running_one():
    sim = lp()
    core = sim.core
    core.scheduler.max_num_seqs = 1  # one runs, the others wait
    assert core.take([submit("a"), submit("b"), submit("c", origin=Origin.REROUTE)], 0.0) == []
    step(sim, 0.1)
    assert [r.request_id for r in core.scheduler.running] == ["a"]
    [answer] = core.take([SetRole(role=Role.HP, mode="hp")], 0.2)
    assert isinstance(answer, RoleChanged) and (answer.role, answer.mode) == (Role.HP, "hp")
    assert [r.request_id for r in answer.returned] == ["b"]   # c is pinned: it stays
    assert len(answer.returned[0].prompt_token_ids) == 3000
    scheduler = core.scheduler
    assert scheduler.mode.name == "hp" and scheduler.triage.mode.name == "hp"
    assert scheduler.max_num_seqs == 1024 and core.role is Role.HP
    assert set(scheduler.requests) == {"a", "c"}
    # the running request and the pinned one finish here; an HP with room asks for work
    finished = []
    for t in range(40):
        for message in step(sim, 0.3 + t * 0.05):
            if isinstance(message, StepOutputs):
                finished += [message.tokens.request_ids[i] for i in message.tokens.finished]
    assert sorted(finished) == ["a", "c"] and core.ticket_open


def test_hp_to_lp_drops_its_ticket_and_offloads_again():
    sim = lp()
    core = sim.core
    core.take([SetRole(role=Role.HP, mode="hp")], 0.0)
    assert isinstance(step(sim, 0.1)[-1], Ticket)
    [answer] = core.take([SetRole(role=Role.LP, mode="lp")], 0.2)
    assert answer.role is Role.LP and answer.returned == []
    assert not core.ticket_open and core.scheduler.mode.offloads
    assert step(sim, 0.3) == []  # an LP asks for nothing


def test_the_same_role_or_an_impossible_one_changes_nothing():
    core = lp().core
    core.take([submit("a")], 0.0)
    [same] = core.take([SetRole(role=Role.LP, mode="lp")], 0.1)
    assert same.role is Role.LP and same.returned == [] and "a" in core.scheduler.requests
    [wrong] = core.take([SetRole(role=Role.HP, mode="sarathi")], 0.1)
    assert wrong.role is Role.LP and core.scheduler.mode.name == "lp"
    plain = fake_core(Role.LP, "lp")  # no performance model: it cannot decide by time
    [answer] = plain.take([SetRole(role=Role.HP, mode="hp")], 0.0)
    assert answer.role is Role.LP and plain.scheduler.mode.name == "lp"


def test_set_role_and_its_answer_cross_the_wire():
    from ipc.codec import Encoder, controller_decoder, instance_decoder
    from ipc.messages import InstanceLoad, OffloadedRequest
    encoder = Encoder()
    command = SetRole(role=Role.HP, mode="hp")
    answer = RoleChanged(instance_id=2, role=Role.HP, mode="hp",
                         returned=[OffloadedRequest("r1", [1, 2, 3])],
                         load=InstanceLoad(4, 0, 0.0, 1))
    assert instance_decoder().decode(encoder.encode(command)) == command
    assert controller_decoder().decode(encoder.encode(answer)) == answer
