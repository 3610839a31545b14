"""Discrete-event simulation of a whole box: the daemon's instances and routing on a
virtual clock.

Each instance is the real `Engine` (scheduler, policies, performance model) over a
`SimExecutor` whose latency function is a GPU profile (or `SimConfig.latency`, the
daemon's `--sim-latency`); instead of sleeping, a step's end is an event at now + its
latency. Routing is the controller's `policies.router.Router`. Messages between
controller and instances (submits, tokens, offloads, drops, tickets) each take
`ipc_delay` seconds. Deterministic: same inputs, same run.

An instance follows the instance process's loop (engines/instance.py, DESIGN.md §3):

    drain the submits that reached it -> step -> send the step's tokens, offloads and
    drops -> (HP) ask for a ticket -> drain ...

so a submit that arrives during a step waits for the step's end, what a step takes
out of the queue (offloads, drops) reaches the controller after the step ran, and an
HP asks for a ticket only between steps. Before the first arrival every instance is
ready and every idle HP holds its ticket (the daemon accepts requests only then).
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from bench.records import RequestRecord
from bench.workload import WorkloadRequest
from engines.batch import Batch
from engines.engine import Engine
from engines.executors.latency import make_latency
from engines.executors.profiles.registry import get_profile
from engines.executors.sim_executor import SimExecutor
from engines.modes import get_mode
from engines.perf_setup import profile_perf_model
from engines.scheduler_config import SchedulerConfig
from ipc.params import SamplingParams
from policies.admission import TICKET_BATCH_LIMIT, ticket_wanted
from policies.router import Router


@dataclass(frozen=True)
class SimConfig:
    layout_modes: tuple[str, ...]     # mode per instance, e.g. ("lp", "lp", "hp")
    profile: str = "a100-llama3-8b"
    scheduler: SchedulerConfig = SchedulerConfig()
    ttft_slo: float = 1.0
    tbt_slo: float = 0.15
    block_size: int = 16
    max_model_len: int = 8192
    ipc_delay: float = 0.0005         # one controller <-> instance message, seconds
    #: The sim executor's latency spec, as the daemon's `--sim-latency` ("constant:0.05");
    #: "" = the profile's step times. LP/HP performance models are then calibrated on
    #: what it states, as a daemon's sim instance does.
    latency: str = ""
    #: KV capacity per instance in blocks; None = the profile's (its GPU's memory).
    num_kv_blocks: int | None = None


@dataclass
class SimInstance:
    instance_id: int
    role: str
    engine: Engine
    executor: SimExecutor
    busy: bool = False
    ticket_open: bool = False
    steps: int = 0
    #: Submits that reached the instance and wait for its loop to drain them.
    inbox: list[tuple[str, bool]] = field(default_factory=list)


@dataclass
class _Tracked:
    """The controller's view of one request."""
    work: WorkloadRequest
    record: RequestRecord
    instance: int | None = None
    prompt: list[int] = field(default_factory=list)


class Simulation:
    def __init__(self, config: SimConfig, workload: list[WorkloadRequest]) -> None:
        self.config = config
        self.now = 0.0
        self._events: list = []
        self._seq = itertools.count()
        self.instances = [self._instance(i, mode) for i, mode in enumerate(config.layout_modes)]
        self.router = Router({inst.instance_id: inst.role for inst in self.instances})
        self.tracked = {f"r{w.index}": _Tracked(w, self._record(w)) for w in workload}
        for request_id, tracked in self.tracked.items():
            self._at(tracked.work.arrival, self._arrive, request_id)
        for inst in self.instances:  # ready and idle before the run: HPs hold their tickets
            if self._wants_ticket(inst):
                inst.ticket_open = True
                self._ticket(inst.instance_id)

    # ---- set-up ------------------------------------------------------------------------
    def _instance(self, instance_id: int, mode: str) -> SimInstance:
        cfg = self.config
        profile = get_profile(cfg.profile)
        num_kv_blocks = cfg.num_kv_blocks or profile.num_kv_blocks(cfg.block_size)
        executor = SimExecutor(make_latency(cfg.latency or f"profile:{cfg.profile}"),
                               num_kv_blocks=num_kv_blocks, block_size=cfg.block_size,
                               max_model_len=cfg.max_model_len)
        scheduler = SchedulerConfig(**{**_fields(cfg.scheduler), "mode": mode})
        perf = None
        if get_mode(mode).uses_perf_model:
            if cfg.latency:
                perf = _stated_perf_model(profile, executor, scheduler)
            else:
                perf = profile_perf_model(profile, scheduler, cfg.max_model_len,
                                          executor.num_kv_blocks * cfg.block_size)
        engine = Engine(executor, scheduler, clock=lambda: self.now, perf_model=perf)
        return SimInstance(instance_id, mode, engine, executor)

    def _record(self, work: WorkloadRequest) -> RequestRecord:
        return RequestRecord(index=work.index, arrival=work.arrival, prompt_len=work.prompt_len,
                             output_len=work.output_len)

    # ---- the event loop ----------------------------------------------------------------
    def _at(self, time: float, action, *args) -> None:
        heapq.heappush(self._events, (time, next(self._seq), action, args))

    def run(self) -> list[RequestRecord]:
        while self._events:
            self.now, _, action, args = heapq.heappop(self._events)
            action(*args)
        return [t.record for t in self.tracked.values()]

    # ---- controller --------------------------------------------------------------------
    def _ready(self) -> list[int]:
        return [inst.instance_id for inst in self.instances]

    def _load(self, waiting_only: bool) -> dict[int, int]:
        counts: dict[int, int] = {}
        for t in self.tracked.values():
            if t.instance is not None and t.record.end_time is None and not (
                    waiting_only and t.record.first_token_time is not None):
                counts[t.instance] = counts.get(t.instance, 0) + 1
        return counts

    def _arrive(self, request_id: str) -> None:
        tracked = self.tracked[request_id]
        load = self._load(waiting_only=False) if not self.router.ascendra else {}
        instance_id, _ = self.router.route_new(self._ready(), load)
        tracked.instance = instance_id
        tracked.prompt = [3] * tracked.work.prompt_len
        self._at(self.now + self.config.ipc_delay, self._submit, instance_id, request_id, False)

    def _offloaded(self, request_id: str) -> None:
        hp = self.router.route_offload(self._ready(), self._load(waiting_only=True))
        tracked = self.tracked[request_id]
        tracked.record.offloaded = True
        if hp is None:
            self._end(tracked, "errored", error="offloaded, but the layout has no HP instance")
            return
        tracked.instance = hp
        self._at(self.now + self.config.ipc_delay, self._submit, hp, request_id, True)

    def _ticket(self, instance_id: int) -> None:
        self.router.ticket(instance_id)

    # ---- instances: the instance process's loop ---------------------------------------
    def _submit(self, instance_id: int, request_id: str, offloaded: bool) -> None:
        """A Submit reaches the instance; its loop takes it in before its next step."""
        inst = self.instances[instance_id]
        inst.inbox.append((request_id, offloaded))
        if not inst.busy:
            self._serve(inst)

    def _accept(self, inst: SimInstance, request_id: str, offloaded: bool) -> None:
        tracked = self.tracked[request_id]
        work, cfg = tracked.work, self.config
        if not offloaded:
            inst.ticket_open = False  # a new request came: it used our ticket (or beat it)
        try:
            inst.engine.add_request(
                tracked.prompt, SamplingParams(max_tokens=work.output_len, ignore_eos=True),
                request_id=request_id, arrival_time=work.arrival,
                deadline=work.arrival + cfg.ttft_slo, tbt_slo=cfg.tbt_slo, offloaded=offloaded)
        except ValueError as exc:
            self._end(tracked, "errored", delay=cfg.ipc_delay, error=str(exc))

    def _serve(self, inst: SimInstance) -> None:
        """The loop from its drain until a step is under way (or the instance is idle)."""
        while not inst.busy:
            inbox, inst.inbox = inst.inbox, []
            for request_id, offloaded in inbox:
                self._accept(inst, request_id, offloaded)
            if not inst.engine.has_work:
                self._maybe_ticket(inst)
                return
            batch = inst.engine.begin_step(self.now)
            if batch:
                self._start_step(inst, batch)
            else:  # only offloads or drops left the queue: no step runs, they go at once
                self._left_queue(inst, batch)
                self._maybe_ticket(inst)

    def _start_step(self, inst: SimInstance, batch: Batch) -> None:
        for chunk in batch.chunks:
            record = self.tracked[chunk.request.request_id].record
            if record.sched_delay is None:
                record.sched_delay = self.now - record.arrival
        seconds = inst.executor.latency(batch)
        inst.busy = True
        self._at(self.now + seconds, self._finish_step, inst, batch, seconds)

    def _finish_step(self, inst: SimInstance, batch: Batch, seconds: float) -> None:
        """The step ran: its tokens, then its offloads and drops, go to the controller."""
        inst.busy = False
        inst.steps += 1
        result = inst.engine.finish_step(batch, inst.executor.tokens(batch), seconds, self.now)
        arrive = self.now + self.config.ipc_delay
        for output in result.outputs:
            tracked = self.tracked[output.request_id]
            record = tracked.record
            if record.first_token_time is None:
                record.first_token_time = arrive
            record.token_times.append(arrive)
            if output.finish_reason is not None:
                self._end(tracked, "completed", delay=self.config.ipc_delay,
                          finish_reason=output.finish_reason)
        self._left_queue(inst, batch)
        self._maybe_ticket(inst)
        self._serve(inst)

    def _left_queue(self, inst: SimInstance, batch: Batch) -> None:
        """Offloads travel LP -> controller -> HP; drops are answered by the controller."""
        for request in batch.offloaded:
            self._at(self.now + self.config.ipc_delay, self._offloaded, request.request_id)
        for request in batch.dropped:
            self._end(self.tracked[request.request_id], "dropped", delay=self.config.ipc_delay,
                      error_code="ttft_slo_missed")

    def _wants_ticket(self, inst: SimInstance) -> bool:
        if inst.role != "hp":
            return False
        scheduler, kv = inst.engine.scheduler, inst.engine.kv
        return ticket_wanted(len(scheduler.waiting), len(scheduler.running), TICKET_BATCH_LIMIT,
                             kv.num_free_blocks / kv.num_blocks, inst.ticket_open)

    def _maybe_ticket(self, inst: SimInstance) -> None:
        """HP, between steps: with nothing waiting and room to spare, hold one ticket."""
        if self._wants_ticket(inst):
            inst.ticket_open = True
            self._at(self.now + self.config.ipc_delay, self._ticket, inst.instance_id)

    def _end(self, tracked: _Tracked, outcome: str, delay: float = 0.0, **fields) -> None:
        record = tracked.record
        record.outcome = outcome
        record.end_time = self.now + delay
        record.instance = tracked.instance
        for name, value in fields.items():
            setattr(record, name, value)
        tracked.prompt = []


def _stated_perf_model(profile, executor: SimExecutor, scheduler: SchedulerConfig):
    """A performance model on the profile's model and GPU, calibrated on the synthetic
    batches a daemon's sim instance times at start, at the latency the executor states."""
    from engines.calibration import calibrate, default_shapes, stated_latency
    from policies.perf_model import PerfModel
    perf = PerfModel(profile.model, profile.hardware)
    shapes = default_shapes(executor, scheduler.chunk_size, scheduler.resolved_max_num_seqs())
    calibrate(executor, perf, shapes, repeats=1, timer=stated_latency)
    return perf


def _fields(struct) -> dict:
    return {name: getattr(struct, name) for name in struct.__struct_fields__}
