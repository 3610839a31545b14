"""The controller's decisions, sans-I/O: `handle(event) -> actions`.

One object owns every accepted request from arrival to its one terminal answer: it
holds new requests of an Ascendra layout in its waiting room and binds them to
instances as they free up (`core_dispatch`, `policies.global_queue`) or routes them at
once (`policies.router`), forwards LP offloads to an HP, passes a P/D layout's
prefilled requests to a decode instance (`core_handoff`), passes tokens on, moves the
requests of an instance that died (`core_recovery`, `daemon.core.recovery_plan`), bounds the
waiting queue (`daemon.core.admission_bounds`) and drains on shutdown. It opens no socket, reads
no clock and never sleeps: every event carries `now`, and waits are `StartTimer`
actions. The daemon (`daemon/controller.py`, asyncio + ZeroMQ) and the simulator
(`bench/sim/simulator.py`, an event heap) are its two drivers, so both make the same
decisions for the same events.

It raises only on misuse (an unknown event, a duplicate request id, an illegal state
move), and checks before it changes anything.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec

from daemon.core.controller_config import ControllerConfig, SloConfig
from daemon.core.events import (
    Action,
    Arrived,
    ClientLeft,
    Drain,
    Event,
    FromInstance,
    InstanceDown,
    InstanceReady,
    Moved,
    Refuse,
    Send,
    SendFailed,
    Settle,
    StartAccepting,
    StartTimer,
    TicketOpened,
    Timer,
    TimerFired,
    Token,
)
from daemon.core.late_binding import Dispatch
from daemon.core.handoffs import Handoffs
from daemon.core.prefixes import Prefixes
from daemon.core.recovery import RECOVERY, Recovery
from daemon.core.admission_bounds import WaitingQueue, retry_after
from daemon.core.prefix_index import PrefixIndex
from daemon.core.recovery_plan import recovery_target, reroute_offload
from daemon.core.request_state import Outcome, RequestState, Tracked, Trigger
from ipc.api_codes import EndCode, Refusal
from daemon.core.waiting_room import WaitingRoom
from ipc.messages import (
    Abort,
    Finished,
    FinishReason,
    Handoff,
    Heartbeat,
    InstanceFailed,
    Offload,
    Origin,
    Ready,
    RequestError,
    Role,
    StepOutputs,
    Submit,
    Ticket,
    TokenOutput,
)
from policies.router import Router
from policies.routing import Routing

DRAIN = "drain"


@dataclass(slots=True)
class InstanceView:
    """What the core knows of one instance."""

    instance_id: int
    role: Role
    ready: Ready | None = None     # None: not serving (starting, restarting)
    stats: Heartbeat | None = None  # its last heartbeat since it became ready
    #: Its batch and KV cache as of its latest report (a step's load or a heartbeat).
    num_running: int = 0
    num_kv_blocks_used: int = 0
    #: Requests it holds, and those of them without a first token (insertion-ordered sets).
    held: dict[str, None] = field(default_factory=dict)
    waiting: dict[str, None] = field(default_factory=dict)

    def reported(self, num_running: int, num_kv_blocks_used: int) -> None:
        """Its latest report; one socket per instance keeps them in order, so the last wins."""
        self.num_running, self.num_kv_blocks_used = num_running, num_kv_blocks_used


class ControllerCore(Dispatch, Recovery, Handoffs, Prefixes):
    def __init__(self, roles: Mapping[int, Role], config: ControllerConfig = ControllerConfig(),
                 slo: SloConfig = SloConfig()) -> None:
        self.config, self.slo = config, slo
        self.roles = dict(roles)
        self.instances = {i: InstanceView(i, role) for i, role in sorted(roles.items())}
        lp_ids = [i for i, r in roles.items() if r is Role.LP]
        # the pool new requests go to: LPs, else a P/D layout's prefill instances, else peers
        pool = lp_ids or [i for i, r in roles.items() if r is Role.PREFILL] or [
            i for i, r in roles.items() if r is Role.PEER]
        self.router = Router(pool=pool,
                             hp_ids=[i for i, r in roles.items() if r is Role.HP],
                             routing=config.routing)
        self.requests: dict[str, Tracked] = {}
        self.queue = WaitingQueue(config.max_queued_requests, config.max_queued_tokens)
        #: Late binding (Ascendra layouts with the global queue): requests no instance holds.
        self.room = (WaitingRoom(config.shed, rescue=config.hp_gate,
                                 miss_budget=config.miss_budget,
                                 prefix_aware=config.routing is Routing.PREFIX_AWARE)
                     if config.global_queue and lp_ids else None)
        self.prefixes = PrefixIndex()  # what each instance's prefix cache is known to hold
        self.accepting = self.draining = False
        self.drain_timeout = 0.0
        self._timer_keys = itertools.count()

    # ---- the one entry point ---------------------------------------------------------
    def handle(self, event: Event) -> list[Action]:
        out: list[Action] = []
        match event:
            case Arrived():
                self._arrived(event, out)
            case FromInstance(now=now, message=message):
                self._from_instance(now, message, out)
            case SendFailed():
                self._send_failed(event, out)
            case InstanceDown(now=now, instance_id=instance_id, exit_code=code):
                self._instance_down(now, instance_id, code, out)
            case ClientLeft(request_id=request_id, outcome=outcome):
                self._client_left(request_id, outcome, out)
            case TimerFired(now=now, timer=timer):
                self._timer_fired(now, timer, out)
            case StartAccepting():
                self.accepting = True
            case Drain(now=now, timeout=timeout):
                self.accepting, self.draining, self.drain_timeout = False, True, timeout
                out.append(StartTimer(Timer(DRAIN), now + timeout))
            case _:
                raise TypeError(f"not a controller event: {event!r}")
        return out

    # ---- views -------------------------------------------------------------------------
    def ready_ids(self) -> list[int]:
        return [i for i, view in self.instances.items() if view.ready is not None]

    @property
    def max_model_len(self) -> int:
        """The longest context every ready instance serves (0: none is ready)."""
        lens = [v.ready.max_model_len for v in self.instances.values() if v.ready is not None]
        return min(lens) if lens else 0

    def in_flight(self) -> dict[int, int]:
        return {i: len(view.held) for i, view in self.instances.items()}

    def queued(self) -> dict[int, int]:
        """Requests without a first token, per instance that holds them."""
        return {i: len(view.waiting) for i, view in self.instances.items()}

    # ---- arrivals ----------------------------------------------------------------------
    def _arrived(self, event: Arrived, out: list[Action]) -> None:
        if event.request_id in self.requests:
            raise ValueError(f"duplicate request id {event.request_id!r}")
        refusal = self._refusal(len(event.prompt_token_ids))
        target = None
        names, cached_on = self._look_up_prefix(event.prompt_token_ids)
        if refusal is None and not self.ready_ids():
            refusal = (Refusal.NO_INSTANCE, "no instance is ready; try again shortly")
        elif refusal is None and self.room is None:
            target, _ = self.router.route_new(self.ready_ids(), self.in_flight(), cached_on)
        if refusal is not None:
            out.append(Refuse(event.request_id, *refusal, retry_after(self.slo.ttft_slo)))
            return
        now, ttft_slo = event.now, event.ttft_slo or self.slo.ttft_slo
        submit = Submit(request_id=event.request_id, prompt_token_ids=event.prompt_token_ids,
                        sampling=event.sampling, arrival_time=now, deadline=now + ttft_slo,
                        ttft_slo=ttft_slo, tbt_slo=event.tbt_slo or self.slo.tbt_slo,
                        priority=event.priority)
        state = RequestState.QUEUED if self.room is None else RequestState.PENDING
        tracked = Tracked(event.request_id, now, submit, submit, state=state,
                          block_names=names, cached_on=cached_on)
        self.requests[event.request_id] = tracked
        self.queue.add(len(event.prompt_token_ids))
        if self.room is None:
            self._send_to(tracked, target, submit, out)
            return
        self.room.add(tracked)
        self._dispatch(now, out)

    def _refusal(self, num_tokens: int) -> tuple[Refusal, str] | None:
        if self.draining:
            return Refusal.SHUTTING_DOWN, "the server is shutting down and accepts no new requests"
        if not self.accepting:
            return Refusal.STARTING, "the server is starting; try again shortly"
        full = self.queue.refusal(num_tokens)
        return (Refusal.QUEUE_FULL, full) if full is not None else None

    # ---- messages from instances -------------------------------------------------------
    def _from_instance(self, now: float, message, out: list[Action]) -> None:
        if isinstance(message, Ready):
            self._ready(message, out)
            self._dispatch(now, out)
            return
        view = self.instances.get(message.instance_id)
        if isinstance(message, InstanceFailed) or view is None or view.ready is None:
            # InstanceFailed: its exit follows. Not ready: the last words of a process that
            # has died since (its requests have moved on) -- nothing of it reaches them.
            return
        match message:
            case StepOutputs(outputs=outputs, load=load):
                self._found_cached(view, message.cached)
                self._tokens(now, view, outputs, out)
                if load is not None:
                    view.reported(load.num_running, load.num_kv_blocks_used)
                if self.room is not None and load is not None:
                    self.room.reported(view.instance_id, load)
                    self._dispatch(now, out)
            case Heartbeat():
                view.stats = message
                view.reported(message.num_running, message.num_kv_blocks_used)
            case Offload():
                self._offloaded(now, view, message, out)
            case Handoff():
                self._handed_off(now, view, message, out)
            case Ticket(instance_id=instance_id):
                if self.router.ticket(instance_id):
                    out.append(TicketOpened(instance_id))
                    self._dispatch(now, out)
            case Finished(request_id=request_id, reason=reason):
                tracked = self._held(request_id, view)
                if tracked is not None:
                    self._finished_early(tracked, reason, out)
            case RequestError(request_id=request_id, message=text):
                tracked = self._held(request_id, view)
                if tracked is not None:
                    self._end(tracked, Outcome.REJECTED, EndCode.INVALID, text, out)
            case _:
                raise TypeError(f"not an instance message: {message!r}")

    def _ready(self, ready: Ready, out: list[Action]) -> None:
        view = self.instances.get(ready.instance_id)
        if view is None:
            return  # a ghost: no instance of the layout has that id
        view.ready, view.stats = ready, None
        view.reported(0, 0)
        self.prefixes.ready(ready)
        if self.room is not None:
            self.room.ready(ready)
        out.append(InstanceReady(ready))
        self._place_moving(out)

    def _tokens(self, now: float, view: InstanceView, outputs: list[TokenOutput],
                out: list[Action]) -> None:
        """A step's tokens, in order: `_token` of each. The commonest case -- a streaming
        request's next token, not its last -- is written out here (one per token of every
        request: the controller's hot path); the rest go through `_token`."""
        held, requests, emit = view.held, self.requests, out.append
        for output in outputs:
            tracked = requests.get(output.request_id) if output.request_id in held else None
            if (tracked is None or tracked.first_token_time is None
                    or output.finish_reason is not None):
                self._token(now, view, output, out)
                continue
            tbt, tracked.last_token_time = now - tracked.last_token_time, now
            tracked.token_ids.append(output.token_id)
            emit(Token(tracked.request_id, output, None, tbt))

    def _token(self, now: float, view: InstanceView, output: TokenOutput,
               out: list[Action]) -> None:
        tracked = self._held(output.request_id, view)
        if tracked is None:
            return  # settled already (a client that left: its abort is on its way)
        ttft = tbt = None
        if tracked.first_token_time is None:
            self._unqueue(tracked)
            tracked.first_token_time, ttft = now, now - tracked.arrival_time
            tracked.advance(Trigger.FIRST_TOKEN)
        else:
            tbt = now - tracked.last_token_time
        tracked.last_token_time = now
        tracked.token_ids.append(output.token_id)
        out.append(Token(tracked.request_id, output, ttft, tbt))
        if output.finish_reason is not None:
            self._end(tracked, Outcome.COMPLETED, None, "", out)

    def _finished_early(self, tracked: Tracked, reason: FinishReason, out: list[Action]) -> None:
        if reason is FinishReason.DROP:
            self._end(tracked, Outcome.DROPPED, EndCode.TTFT_SLO_MISSED,
                      f"dropped: the request could no longer meet its TTFT SLO ({reason.value})", out)
        else:
            self._end(tracked, Outcome.ERRORED, EndCode.ENDED_EARLY,
                      f"the request ended early on its instance ({reason.value})", out)

    def _offloaded(self, now: float, view: InstanceView, message: Offload,
                   out: list[Action]) -> None:
        """LP -> controller -> HP: prompt tokens only, same arrival and deadline. With the
        global queue, only to an HP that can still finish it in time (else it waits at the
        controller again); without, to the HP with the shortest queue. With no HP ready,
        back to the least loaded ready instance, pinned there (`reroute_offload`)."""
        for moved in message.requests:
            tracked = self._held(moved.request_id, view)
            if tracked is None:
                continue  # the client left meanwhile
            self._release(tracked)
            submit = msgspec.structs.replace(tracked.submit, origin=Origin.OFFLOAD,
                                             prompt_token_ids=moved.prompt_token_ids)
            ready = self.ready_ids()
            if self.room is not None and self.config.hp_gate:
                target = self._rescuer(now, submit, tracked.cached_on)
                if target is None:
                    tracked.advance(Trigger.REQUEUED)
                    tracked.requeued = True
                    self.room.add(tracked)
                    continue
            else:
                target = self.router.route_offload(ready, self.queued())
            if target is None:
                submit = reroute_offload(submit)
                target = recovery_target(ready, self.roles, self.queued(), self.in_flight())
            if target is None:
                self._end(tracked, Outcome.ERRORED, EndCode.UNAVAILABLE,
                          "offloaded, but no instance is ready", out)
                continue
            tracked.offloaded = True
            tracked.advance(Trigger.OFFLOADED)
            self._send_to(tracked, target, submit, out)
            out.append(Moved(tracked.request_id, submit.origin, view.instance_id, target))
        self._dispatch(now, out)

    # ---- clients, timers ---------------------------------------------------------------
    def _client_left(self, request_id: str, outcome: Outcome, out: list[Action]) -> None:
        tracked = self.requests.get(request_id)
        if tracked is None:
            return  # it had ended already
        holder = tracked.instance
        self._end(tracked, outcome, None, "", out)
        if holder is not None:  # None: between instances, held by none
            out.append(Send(holder, Abort(request_id=request_id)))

    def _timer_fired(self, now: float, timer: Timer, out: list[Action]) -> None:
        if timer.kind == RECOVERY:
            for tracked in list(self.requests.values()):
                if tracked.state is RequestState.MOVING and tracked.give_up_time <= now:
                    self._end(tracked, Outcome.ERRORED, EndCode.INSTANCE_FAILED,
                              f"{tracked.why_moving}, and no instance could take it over within "
                              f"{self.config.recovery_timeout:g} s; retry it", out)
        elif timer.kind == DRAIN:
            for tracked in list(self.requests.values()):
                self._end(tracked, Outcome.ERRORED, EndCode.SHUTTING_DOWN,
                          "the server is shutting down and this request did not finish within "
                          f"the drain timeout ({self.drain_timeout:g} s)", out)
        else:
            raise ValueError(f"unknown timer {timer!r}")

    # ---- bookkeeping -------------------------------------------------------------------
    def _held(self, request_id: str, view: InstanceView) -> Tracked | None:
        """The request if `view`'s instance holds it now (not a former holder)."""
        return self.requests.get(request_id) if request_id in view.held else None

    def _send_to(self, tracked: Tracked, target: int, submit: Submit, out: list[Action]) -> None:
        view = self.instances[target]
        tracked.instance, tracked.submit = target, submit
        if self.room is not None:  # what it will compute: its prompt less a cached prefix
            self.room.sent(target, len(submit.prompt_token_ids) - tracked.cached_on.get(target, 0))
        view.held[tracked.request_id] = None
        if tracked.waiting:
            view.waiting[tracked.request_id] = None
        self._prefix_sent(tracked, target)
        out.append(Send(target, submit))

    def _release(self, tracked: Tracked) -> None:
        if tracked.instance is not None:
            view = self.instances[tracked.instance]
            view.held.pop(tracked.request_id, None)
            view.waiting.pop(tracked.request_id, None)
            tracked.instance = None

    def _unqueue(self, tracked: Tracked) -> None:
        """It got its first token or ended: it no longer waits (once per request)."""
        if tracked.waiting:
            self.queue.remove(len(tracked.original.prompt_token_ids))
            if tracked.instance is not None:
                self.instances[tracked.instance].waiting.pop(tracked.request_id, None)

    def _end(self, tracked: Tracked, outcome: Outcome, code: EndCode | None, message: str,
             out: list[Action]) -> None:
        holder = tracked.instance
        if self.room is not None:
            self.room.remove(tracked)
        self._unqueue(tracked)
        self._release(tracked)
        tracked.advance(Trigger.ENDED)
        del self.requests[tracked.request_id]
        e2e = (tracked.last_token_time - tracked.arrival_time
               if tracked.last_token_time is not None else None)
        again = retry_after(self.slo.ttft_slo) if outcome is Outcome.DROPPED else None
        self._prefix_completed(tracked, holder if outcome is Outcome.COMPLETED else None)
        out.append(Settle(tracked.request_id, outcome, code, message, holder, e2e, again,
                          len(tracked.original.prompt_token_ids), tracked.num_cached_tokens))
