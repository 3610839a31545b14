"""`serving_info` (ipc/serving_info.py): where the daemon served a response's choices.

The controller core's `Settle` carries it (instances, offloaded, queue delay); a
simulated run's records (bench/sim/record_keeper.py) observe the same core, so a live
client reading `serving_info` records what a simulated run does. Then the HTTP API
writes it when asked, in every shape of answer: a body, a stream's last chunk, an error.
"""
from __future__ import annotations

import json

import pytest

from bench.loadgen.workloads import build_requests, workload
from bench.sim.simulator import Simulation
from daemon.core.events import Settle
from tests.simulator_helpers import sim_config


IPC_DELAY = sim_config("1xsarathi").ipc_delay


def settled_run(layout: str, qps: float, n: int = 120) -> tuple[dict, dict[str, Settle]]:
    """A simulated run's records, and the `Settle` of each request that got one."""
    settles: dict[str, Settle] = {}
    work = build_requests(workload("poisson"), rate=qps, num_requests=n, seed=0,
                          max_model_len=8192)
    sim = Simulation(sim_config(layout), work)
    observe = sim.keeper.observe

    def watching(action, now):
        if isinstance(action, Settle):
            settles[action.request_id] = action
        observe(action, now)

    sim.keeper.observe = watching
    sim.run()
    return sim.records, settles


@pytest.mark.parametrize("layout, qps", [("2L1H", 40.0), ("1P1D", 10.0), ("3xsarathi", 20.0), ("3A", 40.0)])
def test_a_settle_places_a_request_as_the_simulators_records_do(layout, qps):
    records, settles = settled_run(layout, qps)
    assert len(settles) == len(records)
    for request_id, settle in settles.items():
        record = records[request_id]
        assert list(settle.instances) == record.instances, request_id
        assert settle.offloaded == record.offloaded, request_id
        if record.sched_delay is None:
            assert settle.queue_delay is None, request_id
        else:  # the end of the step that admitted it as the controller got it (one message's
            # transit later), less the step's length
            assert settle.queue_delay == pytest.approx(record.sched_delay + IPC_DELAY,
                                                       abs=1e-9), request_id
    if layout == "2L1H":
        assert any(s.offloaded for s in settles.values())
    if layout == "1P1D":
        assert all(len(s.instances) == 2 for s in settles.values() if s.outcome.value == "completed")
