"""`GET /health`: the daemon's state as typed structs, written by the daemon and read by `bench`.

`status` is "ok" while accepting with every instance ready, "degraded" while one is
down or restarting, "draining" after SIGTERM (and while starting). The API answers
200 for "ok", 503 otherwise, so a probe or a load balancer can use the status code.
"""
from __future__ import annotations

from typing import Literal

import msgspec

from daemon.controller_core import ControllerCore
from daemon.supervisor import Supervisor

Status = Literal["ok", "degraded", "draining"]


class InstanceHealth(msgspec.Struct, kw_only=True):
    id: int
    role: str                 # lp | hp | peer
    mode: str                 # the scheduler mode: sarathi | vllm | lp | hp
    pid: int | None
    state: str                # starting | ready | restarting | stopped
    restarts: int
    in_flight: int            # requests the controller has sent it and not seen end
    waiting: int              # its waiting queue, from its last heartbeat
    running: int
    kv_blocks_used: int
    kv_blocks_total: int
    preemptions: int
    served: int               # requests it served to the end
    offloaded: int            # requests it handed to an HP
    dropped: int
    ticket_open: bool
    perf_model_mape: float | None  # held-out error of its performance model (0.1 = 10 %)


class Health(msgspec.Struct, kw_only=True):
    status: Status
    model: str
    requests_in_flight: int
    queued_requests: int      # accepted, no first token yet (bounded: max_queued_requests)
    queued_tokens: int        # their prompt tokens (bounded: max_queued_tokens)
    instances: list[InstanceHealth] = []

    @property
    def perf_model_mape(self) -> float | None:
        """The mean performance-model error over the instances that report one."""
        values = [i.perf_model_mape for i in self.instances if i.perf_model_mape is not None]
        return sum(values) / len(values) if values else None


def build_health(core: ControllerCore, supervisor: Supervisor, model_name: str) -> Health:
    instances = []
    for slot in supervisor.slots.values():
        view = core.instances[slot.instance_id]
        beat, ready = view.stats, view.ready
        instances.append(InstanceHealth(
            id=slot.instance_id, role=view.role.value, mode=slot.config.scheduler.mode,
            pid=slot.pid, state=slot.state.value, restarts=slot.restarts,
            in_flight=len(view.held),
            waiting=beat.num_waiting if beat else 0, running=beat.num_running if beat else 0,
            kv_blocks_used=beat.num_kv_blocks_used if beat else 0,
            kv_blocks_total=ready.num_kv_blocks if ready else 0,
            preemptions=beat.num_preemptions if beat else 0,
            served=beat.num_finished if beat else 0, offloaded=beat.num_offloaded if beat else 0,
            dropped=beat.num_dropped if beat else 0,
            ticket_open=core.router.tickets.is_open(slot.instance_id),
            perf_model_mape=beat.perf_model_mape if beat else None))
    all_ready = all(i.state == "ready" for i in instances)
    status: Status = ("ok" if core.accepting and all_ready
                      else "degraded" if core.accepting else "draining")
    return Health(status=status, model=model_name, requests_in_flight=len(core.requests),
                  queued_requests=core.queue.requests, queued_tokens=core.queue.tokens,
                  instances=instances)
