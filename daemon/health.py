"""`GET /health`: the daemon's state as typed structs, written by the daemon and read by `bench`;
and the two Kubernetes probes, `GET /livez` and `GET /readyz`.

`status` is "ok" while accepting with every instance ready, "degraded" while one is
down or restarting, "draining" after SIGTERM (and while starting). The API answers
200 for "ok", 503 otherwise, so a probe or a load balancer can use the status code.

The probes answer narrower questions (docs/gateway_protocol.md). Ready: send it new
requests -- it accepts them and at least one instance serves (false while starting,
draining, or while every instance restarts), so Kubernetes, and with it the
InferencePool's endpoint picker, takes a box that cannot serve out of rotation. Live:
the daemon itself is sound -- the HTTP loop answers and an instance serves, or it is
draining -- the same condition the systemd watchdog is fed on, so a box none of whose
instances comes back is restarted, and one merely degraded is not.
"""
from __future__ import annotations

import time
from typing import Literal

import msgspec

from daemon.core.core_view import CoreView
from daemon.supervisor import Supervisor

Status = Literal["ok", "degraded", "draining"]


class InstanceHealth(msgspec.Struct, kw_only=True):
    id: int
    model: str = ""           # the served name of the model it runs
    role: str                 # lp | hp | peer
    mode: str                 # the scheduler mode: sarathi | vllm | lp | hp
    pid: int | None
    state: str                # starting | ready | restarting | stopped
    restarts: int
    in_flight: int            # requests the controller has sent it and not seen end
    waiting: int              # its waiting queue, from its last heartbeat
    running: int              # its batch, and its KV blocks in use, from its latest report
    kv_blocks_used: int
    kv_blocks_total: int
    preemptions: int
    served: int               # requests it completed since the daemon started (as /metrics counts them)
    offloaded: int            # requests it handed to an HP
    dropped: int
    ticket_open: bool
    perf_model_mape: float | None  # held-out error of its performance model (0.1 = 10 %)
    # as its Ready said (1, [], [] until it is ready):
    tp: int = 1               # its tensor-parallel degree (ranks, one process each)
    devices: list[int] = []   # the GPU ids it is pinned to, rank by rank; []: CPU or unpinned
    rank_pids: list[int] = []  # pids of its ranks 1..tp-1 (rank 0 is `pid`)
    #: `<n>A` layouts: its last role change, if any (docs/design.md §5.10).
    role_change: RoleChangeHealth | None = None
    #: A multiplexed instance: the models it holds, and each one's KV blocks in use (in
    #: its own blocks, from the last heartbeat; the pool is shared, `kv_blocks_total`
    #: is in its first model's blocks).
    models: list[str] = []
    kv_blocks_by_model: dict[str, int] = {}


class RoleChangeHealth(msgspec.Struct, kw_only=True):
    """An instance's last role change."""
    old: str                  # lp | hp
    new: str
    reason: str               # what the policy saw
    seconds_ago: float


class EspGroupHealth(msgspec.Struct, kw_only=True):
    """A request's ESP group (daemon/core/esp_groups.py) now."""
    request_id: str
    instances: list[int]      # the master (it decodes the request) first
    formed: bool              # every member joined (false: still joining)
    reason: str               # why it was formed


class ModelHealth(msgspec.Struct, kw_only=True):
    """One served model's part of the daemon (its controller and instance group)."""
    name: str
    status: Status
    requests_in_flight: int
    queued_requests: int
    queued_tokens: int


class Health(msgspec.Struct, kw_only=True):
    status: Status
    model: str                # the served model (with several: the one a request without
                              # `model` gets, the first)
    requests_in_flight: int
    queued_requests: int      # accepted, no first token yet (bounded: max_queued_requests)
    queued_tokens: int        # their prompt tokens (bounded: max_queued_tokens)
    instances: list[InstanceHealth] = []
    models: list[ModelHealth] = []  # each served model, in the order of [model] model
    esp_groups: list[EspGroupHealth] = []  # long prompts prefilled over several instances

    @property
    def perf_model_mape(self) -> float | None:
        """The mean performance-model error over the instances that report one."""
        values = [i.perf_model_mape for i in self.instances if i.perf_model_mape is not None]
        return sum(values) / len(values) if values else None


class Probe(msgspec.Struct, kw_only=True):
    ok: bool
    reason: str               # why not ("" when ok)
    instances_ready: int
    instances: int


def readiness(core: CoreView) -> Probe:
    if core.draining:
        why = "draining: the server is shutting down"
    elif not core.accepting:
        why = "starting: the instances are not all ready yet"
    elif not core.ready_ids():
        why = "no instance is ready (restarting)"
    else:
        why = ""
    return _probe(core, why)


def liveness(core: CoreView) -> Probe:
    sound = core.draining or not core.accepting or core.ready_ids()
    return _probe(core, "" if sound else "no instance is ready (restarting)")


def _probe(core: CoreView, why: str) -> Probe:
    return Probe(ok=not why, reason=why, instances_ready=len(core.ready_ids()),
                 instances=len(core.instances))


def build_health(core: CoreView, supervisor: Supervisor, model_name: str,
                 now: float | None = None) -> Health:
    """`now`: the controller's clock (monotonic), for how long ago a role changed."""
    instances = []
    now = time.monotonic() if now is None else now
    for slot in supervisor.slots.values():
        view = core.instances[slot.instance_id]
        beat, ready = view.stats, view.ready
        switched = core.last_role_change(slot.instance_id)
        instances.append(InstanceHealth(
            id=slot.instance_id, model=model_name, role=view.role.value,
            mode=view.role.value if core.dynamic_roles else slot.config.scheduler.mode,
            role_change=None if switched is None else RoleChangeHealth(
                old=switched.old.value, new=switched.new.value, reason=switched.reason,
                seconds_ago=round(max(now - switched.time, 0.0), 1)), pid=slot.pid, state=slot.state.value,
            restarts=slot.restarts, in_flight=len(view.held),
            waiting=beat.num_waiting if beat else 0,
            # the latest report (a step's load or a heartbeat), as the gateway gauges read it
            running=view.num_running if ready else 0,
            kv_blocks_used=view.num_kv_blocks_used if ready else 0,
            kv_blocks_total=ready.num_kv_blocks if ready else 0,
            preemptions=beat.num_preemptions if beat else 0,
            served=view.num_served, offloaded=beat.num_offloaded if beat else 0,
            dropped=beat.num_dropped if beat else 0,
            ticket_open=core.ticket_open(slot.instance_id),
            perf_model_mape=beat.perf_model_mape if beat else None,
            tp=ready.tp if ready else 1, devices=list(ready.devices) if ready else [],
            rank_pids=list(ready.rank_pids) if ready else [],
            models=list(ready.models) if ready else [],
            kv_blocks_by_model=dict(beat.kv_blocks_by_model) if beat else {}))
    all_ready = all(i.state == "ready" for i in instances)
    status: Status = ("ok" if core.accepting and all_ready
                      else "degraded" if core.accepting else "draining")
    health = Health(status=status, model=model_name, requests_in_flight=core.requests_in_flight,
                    queued_requests=core.queued_requests, queued_tokens=core.queued_tokens,
                    instances=instances,
                    esp_groups=[EspGroupHealth(request_id=g.request_id,
                                               instances=list(g.members), formed=g.going,
                                               reason=g.reason) for g in core.esp_groups()])
    health.models = [_as_model(health)]
    return health


def combine_health(parts: list[Health]) -> Health:
    """The daemon's health over several models' (one per controller): counts added up,
    every instance and model listed, and the worst status (draining, then degraded)."""
    if len(parts) == 1:
        return parts[0]
    statuses = {part.status for part in parts}
    status: Status = next(s for s in ("draining", "degraded", "ok") if s in statuses)
    return Health(status=status, model=parts[0].model,
                  requests_in_flight=sum(p.requests_in_flight for p in parts),
                  queued_requests=sum(p.queued_requests for p in parts),
                  queued_tokens=sum(p.queued_tokens for p in parts),
                  instances=[i for p in parts for i in p.instances],
                  models=[m for p in parts for m in p.models or [_as_model(p)]],
                  esp_groups=[g for p in parts for g in p.esp_groups])


def _as_model(health: Health) -> ModelHealth:
    return ModelHealth(name=health.model, status=health.status,
                       requests_in_flight=health.requests_in_flight,
                       queued_requests=health.queued_requests, queued_tokens=health.queued_tokens)
