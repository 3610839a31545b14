"""`<n>A` layouts in the simulator: roles change on mixed SLO classes, none on one class;
no request is lost across a change, dwell times hold and an LP always remains.

Covers: daemon/core/role_switch.py, policies/roles.py, bench/sim/simulator.py.
"""
from __future__ import annotations

import pytest

from bench.loadgen.workloads import build_requests, workload
from bench.sim.sim_instances import SimConfig
from bench.sim.simulator import Simulation
from daemon.core.controller_config import ControllerConfig
from daemon.layout import dynamic_roles, layout_modes
from ipc.messages import Role
from policies.roles import RoleParams


def run(name: str, qps: float, num_requests: int,
        hps_in_bursts: bool = ControllerConfig().hps_in_bursts) -> Simulation:
    config = SimConfig(layout_modes=tuple(layout_modes("3A")), dynamic_roles=dynamic_roles("3A"),
                       controller=ControllerConfig(hps_in_bursts=hps_in_bursts))
    sim = Simulation(config, build_requests(workload(name), rate=qps, num_requests=num_requests,
                                            seed=0, max_model_len=config.max_model_len))
    sim.run()
    return sim


def test_the_layout_reads_as_lps_whose_roles_change():
    assert layout_modes("3A") == ["lp"] * 3 and dynamic_roles("3A")
    assert not dynamic_roles("2L1H") and layout_modes("1A") == ["lp"]


@pytest.mark.slow
def test_mixed_slo_classes_turn_lps_into_hps_and_lose_no_request():
    sim = run("mixed-slo", qps=13.0, num_requests=700)
    switches = sim.keeper.role_switches
    assert switches and switches[0].new is Role.HP
    records = list(sim.records.values())
    assert all(r.outcome != "lost" for r in records)       # every request got its answer
    # never zero LPs; an instance keeps a role at least the dwell time
    roles = {i: Role.LP for i in range(3)}
    since = {i: -float("inf") for i in range(3)}
    for s in switches:
        assert s.time - since[s.instance_id] >= RoleParams().dwell
        roles[s.instance_id], since[s.instance_id] = s.new, s.time
        assert any(r is Role.LP for r in roles.values())
    served = {r.role for r in records if r.first_token_time is not None}
    assert served == {"lp", "hp"}
    # the simulator's instances are in the roles the controller believes
    assert {s.instance_id: s.core.role for s in sim.instances} == sim.controller.ledger.role_of


@pytest.mark.slow
def test_one_slo_class_keeps_every_instance_an_lp():
    sim = run("poisson", qps=13.0, num_requests=500)
    assert sim.keeper.role_switches == []
    assert all(s.core.role is Role.LP for s in sim.instances)


@pytest.mark.slow
def test_bursts_turn_an_lp_into_an_hp_that_stays_between_bursts():
    """bursty-cv4 (one SLO class): by default an HP keeps the longest prompts above their
    floor in a burst (docs/design.md §5.10) -- one of three instances -- and the quiet
    spells between bursts do not send it back. With `hps_in_bursts` off the same traffic
    keeps three LPs (the paper's rule)."""
    assert run("bursty-cv4", qps=2.5, num_requests=600, hps_in_bursts=False
               ).keeper.role_switches == []
    sim = run("bursty-cv4", qps=2.5, num_requests=600)
    switches = sim.keeper.role_switches
    assert [s.new for s in switches] == [Role.HP]
    assert all("bursts" in s.reason for s in switches)
    assert all(r.outcome != "lost" for r in sim.records.values())
