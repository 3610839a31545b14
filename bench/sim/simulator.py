"""Discrete-event simulation of a whole box: the daemon's two cores on a virtual clock.

The controller is the daemon's `ControllerCore`; each instance the real `InstanceCore`
over a simulated executor (bench/sim/sim_instances.py). This file is only their second
driver -- an event heap instead of asyncio and ZeroMQ: every message between
controller and instances is the real wire struct and takes `ipc_delay` seconds; a
step's end is an event at now + its predicted latency. Deterministic: same inputs,
same run.

An instance follows its core's turn (engines/instance_core.py), as the instance process
(engines/instance.py) does:

    take the commands that reached it -> begin_step -> run the batch: its end is an event
    at now + the executor's predicted latency -> finish_step (the step's tokens, offloads,
    drops, an HP's ticket) -> take ...   (no batch: begin_step's outputs end the turn)

so a submit that arrives during a step waits for the step's end, and what a step takes
out of the queue reaches the controller after the step ran. The sim executor keeps no KV
cache, so the core asks for no KV moves: its outputs are all wire messages. Before the first arrival
every instance is ready and every idle HP holds its ticket (the daemon accepts
requests only then). Records are kept from the controller's actions
(bench/sim/record_keeper.py), as the daemon's metrics are.

The clock is an `EventHeap` (bench/sim/event_heap.py): a box's own, or one shared by the
boxes of a fleet (bench/sim/fleet.py), whose gateway hands each box its requests as they
arrive (`arrive`) instead of the box scheduling a workload of its own.
"""
from __future__ import annotations

from bench.loadgen.workload import WorkloadRequest, request_prompt
from bench.records.schema import RequestRecord
from bench.sim.host_charges import arrival_delay, host_costs
from bench.sim.event_heap import EventHeap
from bench.sim.kv_transfer_time import kv_transfer_seconds
from bench.sim.record_keeper import RecordKeeper
from bench.sim.sim_instances import SimConfig, SimInstance, build_instance
from daemon.core.controller_core import ControllerCore
from daemon.core.events import Arrived, FromInstance, Send, StartAccepting, StartTimer, TimerFired
from engines.batch import Batch
from engines.esp_parts import EspStep
from engines.executors.profiles.esp_time import esp_prefill_time
from engines.executors.profiles.registry import get_profile
from ipc.params import SamplingParams
from policies.tenants import DEFAULT_TENANT

__all__ = ["SimConfig", "Simulation"]

#: The seed of the simulated prompts' tokens: only which prompts share which parts
#: matters (prefix caching), never the ids themselves.
PROMPT_SEED = 0


class Simulation:
    def __init__(self, config: SimConfig, workload: list[WorkloadRequest],
                 watched: range = range(0), events: EventHeap | None = None) -> None:
        """`watched`: indices of the requests whose misses `run(give_up_after=...)` counts;
        `events`: a clock shared with other boxes (a fleet's), else one of its own."""
        self.config = config
        self.events = events if events is not None else EventHeap()
        self.stopped_early = False
        self.instances = [build_instance(config, i, mode)
                          for i, mode in enumerate(config.layout_modes)]
        self.controller = ControllerCore({s.instance_id: s.core.role for s in self.instances},
                                         config.controller, config.slo,
                                         dynamic_roles=config.dynamic_roles,
                                         tenants=config.tenants, esp=config.esp)
        #: a measured profile's host cost of a request (bench/sim/host_charges.py), else 0
        self.arrival_delay = arrival_delay(host_costs(get_profile(config.profile),
                                                      config.latency), config.ipc_delay)
        self.records = {f"r{w.index}": _record(w) for w in workload}
        self.keeper = RecordKeeper(self.records, config.slo, watched)
        #: ESP groups' prefill chunks (request id, first position) some members have
        #: begun: (instance, its step).
        self._esp_begun: dict[tuple[str, int], list[tuple[SimInstance, EspStep]]] = {}
        #: The members that reached each of those chunks (waiting, or in a step of their
        #: own decodes meanwhile).
        self._esp_arrived: dict[tuple[str, int], set[int]] = {}
        self._start_up()
        for request_id, work in zip(self.records, workload):
            self._at(work.arrival, self._arrive, request_id, work)

    def _start_up(self) -> None:
        """Before the run: every instance ready, every idle HP holding its ticket."""
        for sim in self.instances:
            self._controller(FromInstance(0.0, sim.core.ready(pid=0, executor_kind="sim")))
        self._controller(StartAccepting(0.0))
        for sim in self.instances:
            for message in sim.core.ask_for_work():
                self._controller(FromInstance(0.0, message))

    # ---- the event loop ----------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.events.now

    def _at(self, time: float, handler, *args) -> None:
        self.events.at(time, handler, *args)

    def run(self, give_up_after: int | None = None) -> list[RequestRecord]:
        """Every event to the end; or stop once more than `give_up_after` watched requests
        have missed their SLOs (`stopped_early` is then set: the rest stay unfinished)."""
        limit = float("inf") if give_up_after is None else give_up_after
        while self.events:
            self.events.run_next()
            if self.keeper.misses > limit:
                self.stopped_early = True
                break
        return list(self.records.values())

    # ---- the controller's side ---------------------------------------------------------
    def arrive(self, work: WorkloadRequest) -> None:
        """A request reaches the box now (sent by a fleet's gateway): recorded, then
        handed to the controller as any arrival."""
        request_id = f"r{work.index}"
        self.keeper.add(request_id, _record(work))
        self._arrive(request_id, work)

    def _arrive(self, request_id: str, work: WorkloadRequest) -> None:
        if self.arrival_delay:  # the host's path to the controller, measured
            self._at(self.now + self.arrival_delay, self._reach_controller, request_id, work)
        else:
            self._reach_controller(request_id, work)

    def _reach_controller(self, request_id: str, work: WorkloadRequest) -> None:
        sampling = SamplingParams(max_tokens=work.output_len, ignore_eos=True)
        self._controller(Arrived(self.now, request_id, request_prompt(work, PROMPT_SEED),
                                 sampling, work.ttft_slo, work.tbt_slo, priority=work.priority,
                                 tenant=work.tenant or DEFAULT_TENANT, model=work.model))

    def _controller(self, event) -> None:
        now, keeper = self.now, self.keeper
        for action in self.controller.handle(event):
            kind = type(action)
            keeper.observe(action, now)
            if kind is Send:
                delay = self.config.ipc_delay + kv_transfer_seconds(
                    self.config.profile, self.config.interconnect, action.message)
                self._at(now + delay, self._deliver,
                         self.instances[action.instance_id], action.message)
            elif kind is StartTimer:
                self._at(action.at, self._timer, action.timer)

    def _timer(self, timer) -> None:
        self._controller(TimerFired(self.now, timer))

    def _from_instance(self, message) -> None:
        self._controller(FromInstance(self.now, message))

    def _to_controller(self, messages) -> None:
        for message in messages:
            self._at(self.now + self.config.ipc_delay, self._from_instance, message)

    # ---- the instances' side: the core's turn -----------------------------------------
    def _deliver(self, sim: SimInstance, command) -> None:
        """A command reaches the instance; its loop takes it in before its next step."""
        sim.inbox.append(command)
        if not sim.busy:
            self._serve(sim)

    def _serve(self, sim: SimInstance) -> None:
        """Turns from the drain until a step is under way (or the instance is idle)."""
        core = sim.core
        while True:
            inbox, sim.inbox = sim.inbox, []
            self._to_controller(core.take(inbox, self.now))
            batch, outputs = core.begin_step(self.now)
            if type(batch) is EspStep:
                self._begin_esp(sim, batch)
                return
            if batch:
                self._start_step(sim, batch)
                return
            # nothing to run: what left the queue (offloads, drops) and a ticket go at once
            self._to_controller(outputs)
            if not core.has_work:
                return

    def _start_step(self, sim: SimInstance, batch: Batch) -> None:
        # a decode follows the request's prefill: its delay is set
        for chunk in [c for c in batch.added if not c.is_decode]:
            record = self.records[chunk.request.request_id]
            if record.sched_delay is None:
                record.sched_delay = self.now - record.arrival
        seconds = sim.executor.latency(batch)
        if self.config.speed_trace is not None:
            seconds *= self.config.speed_trace.at(self.now)
        sim.busy = True
        self._at(self.now + seconds, self._finish_step, sim, batch, seconds)

    def _begin_esp(self, sim: SimInstance, step: EspStep) -> None:
        """A member reached a chunk of its ESP group's prefill. Until every member has,
        it runs steps of its own decodes (`InstanceCore.waiting_step`) and, with none,
        waits (busy, as in the chunk's first collective); once all wait there, all run it
        together, for the chunk's price on the profile
        (engines/executors/profiles/esp_time.py)."""
        key = (step.request_id, step.begin)
        arrived = self._esp_arrived.setdefault(key, set())
        arrived.add(sim.instance_id)
        begun = self._esp_begun.setdefault(key, [])
        if len(arrived) < step.degree:
            batch = sim.core.waiting_step(self.now)
            if batch:
                self._start_step(sim, batch)
                return
        sim.busy = True
        begun.append((sim, step))
        if len(begun) < step.degree:
            return
        del self._esp_begun[key], self._esp_arrived[key]
        if len({own.stop for _, own in begun}) > 1:
            raise RuntimeError(f"esp: the members of {step.request_id!r}'s group cut its "
                               f"chunk at {sorted({own.stop for _, own in begun})}")
        record = self.records[step.request_id]
        if record.sched_delay is None:
            record.sched_delay = self.now - record.arrival
        seconds = esp_prefill_time(get_profile(self.config.profile), step.stop,
                                   step.degree, step.begin).total
        for member, own in begun:
            member.executor.busy_time += seconds
            self._at(self.now + seconds, self._finish_esp, member, own)

    def _finish_esp(self, sim: SimInstance, step: EspStep) -> None:
        sim.busy = False
        self._to_controller(sim.core.finish_esp(step, self.now))
        self._serve(sim)

    def _finish_step(self, sim: SimInstance, batch: Batch, seconds: float) -> None:
        sim.busy = False
        self._to_controller(sim.core.finish_step(batch, sim.executor.tokens(batch), seconds,
                                                 self.now))
        self._serve(sim)


def _record(work: WorkloadRequest) -> RequestRecord:
    return RequestRecord(index=work.index, arrival=work.arrival, prompt_len=work.prompt_len,
                         output_len=work.output_len, ttft_slo=work.ttft_slo,
                         tbt_slo=work.tbt_slo, slo_class=work.slo_class, warmup=work.warmup,
                         tenant=work.tenant, priority=work.priority, model=work.model)
