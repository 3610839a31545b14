"""The controller's decisions, sans-I/O: `ControllerCore.handle(event) -> actions`.

One object owns every accepted request from arrival to its one terminal answer. It is
made of components with explicit state, each the one owner of its own and called from
here with what it needs:

* `Ledger` (ledger.py): the books -- every request (`Tracked`, request_state.py), every
  instance (`InstanceView`) and its role, the admission bounds (admission_bounds.py);
  the one place a request is sent, released or ended (its `Settle`). It knows no other
  component;
* `WaitingRoom` (waiting_room.py, backlogs.py): an Ascendra layout's requests no
  instance holds yet, the instances' predicted prefill backlogs, binding the requests to
  instances as they free up (`policies.global_queue`), rescuing them on an HP or
  shedding them, and the HP gate; without one, new requests are routed at once
  (`policies.router`);
* `PrefixIndex` (prefix_index.py): what each instance is known to cache;
* `Recovery` (recovery.py, planned by recovery_plan.py): the requests of an instance
  that died move to another;
* `Handoffs` (handoffs.py): a P/D layout's prefilled requests go on to a decode instance;
* `Roles` (role_switch.py): an `<n>A` layout's instances change between LP and HP.

After every send and end -- the ledger notes each, whoever made it -- the core tells the
waiting room and the prefix index (`_follow`), whose structures follow them. Drivers,
/health and /metrics read the core through its `view` (core_view.py), never its parts.

Here: arrivals (refused, routed or put in the waiting room), messages from instances
(tokens -- the per-token hot path --, offloads, tickets, ends), clients that leave,
timers and the drain. It opens no socket, reads no clock and never sleeps: every event
carries `now`, and waits are `StartTimer` actions (events.py). The daemon
(`daemon/controller.py`, asyncio + ZeroMQ) and the simulator (`bench/sim/simulator.py`, an
event heap) are its two drivers, so both make the same decisions for the same events.

It raises only on misuse (an unknown event, a duplicate request id, an illegal state
move), and checks before it changes anything.
"""
from __future__ import annotations

from collections.abc import Mapping

import msgspec

from daemon.core.admission_bounds import retry_after
from daemon.core.controller_config import ControllerConfig, SloConfig, TenantsConfig
from daemon.core.core_view import CoreView
from daemon.core.esp_groups import EspGroups, EspSettings
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
    StartAccepting,
    StartTimer,
    TicketOpened,
    Timer,
    TimerFired,
    Tokens,
)
from daemon.core.handoffs import Handoffs
from daemon.core.ledger import InstanceView, Ledger, Sent
from daemon.core.prefix_index import PrefixIndex
from daemon.core.queue_ttl import TTL, QueueTtl
from daemon.core.recovery import RECOVERY, Recovery
from daemon.core.recovery_plan import recovery_target, reroute_offload
from daemon.core.request_state import Outcome, RequestState, Tracked, Trigger
from daemon.core.role_switch import Roles
from daemon.core.waiting_room import OVERDUE, Binding, WaitingRoom
from ipc.api_codes import EndCode, Refusal
from ipc.messages import (
    Abort,
    EspJoined,
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
    RoleChanged,
    StepOutputs,
    StepTokens,
    Submit,
    Ticket,
)
from policies.mux_share import model_affine_loads
from policies.roles import FAIR_BURST_HP_SHARE, RoleParams
from policies.router import Router
from policies.tenants import TenantShares

DRAIN = "drain"


def _role_params(config: ControllerConfig) -> RoleParams:
    """The role policy's parameters: under a class floor bursts may take half the
    instances as HPs (policies/roles.py), the floor's way of serving a burst's long
    prompts."""
    share = FAIR_BURST_HP_SHARE if config.class_floor > 0 else RoleParams.burst_hp_share
    return RoleParams(hps_in_bursts=config.hps_in_bursts, burst_hp_share=share)


class ControllerCore:
    """`handle(event) -> actions`. Its parts: `ledger` (requests, instances, admission
    bounds), `router` (`policies.router`: routing on arrival, HP tickets), `room` (the
    waiting room; None without the global queue), `prefix_index`, `recovery`,
    `handoffs`, `roles` (None unless roles change online); and whether it accepts new
    requests or drains. `view`: what others may read of it."""

    def __init__(self, roles: Mapping[int, Role], config: ControllerConfig = ControllerConfig(),
                 slo: SloConfig = SloConfig(), dynamic_roles: bool = False,
                 tenants: TenantsConfig = TenantsConfig(), esp: EspSettings = EspSettings(),
                 ) -> None:
        """`dynamic_roles`: an `<n>A` layout, whose instances change between LP and HP
        online (`roles`: the ones they start in); only with late binding. `esp`: ESP
        groups for long prompts (daemon/core/esp_groups.py; the simulator's, not yet the
        daemon's)."""
        self.config, self.slo = config, slo
        lp_ids = [i for i, r in roles.items() if r is Role.LP]
        # the pool new requests go to: LPs, else a P/D layout's prefill instances, else peers
        pool = lp_ids or [i for i, r in roles.items() if r is Role.PREFILL] or [
            i for i, r in roles.items() if r is Role.PEER]
        self.router = Router(pool=pool,
                             hp_ids=[i for i, r in roles.items() if r is Role.HP],
                             routing=config.routing)
        self.ledger = Ledger(roles, config, slo.ttft_slo)
        self.prefix_index = PrefixIndex()
        #: Late binding (Ascendra layouts with the global queue): requests no instance holds.
        self.room = (WaitingRoom(config, self.ledger, self.router.tickets,
                                 tenants=(TenantShares(dict(tenants.tenant_weights))
                                          if tenants.fair_share else None),
                                 per_lp=esp.max_degree > 1)
                     if config.global_queue and lp_ids else None)
        #: `<n>A` layouts: instances change between LP and HP online (daemon/core/role_switch.py).
        self.roles = (Roles(self.ledger, self.router, self.room, _role_params(config))
                      if dynamic_roles and self.room is not None else None)
        self.recovery = Recovery(self.ledger, config)
        self.handoffs = Handoffs(self.ledger, self.recovery)
        self.queue_ttl = QueueTtl(self.ledger)
        #: Long prompts prefilled over several instances (None: ESP off).
        self.esp = EspGroups(self.ledger, esp) if esp.max_degree > 1 else None
        self.accepting = self.draining = False
        self.drain_timeout = 0.0
        self.view = CoreView(self)

    # ---- the one entry point ---------------------------------------------------------
    def handle(self, event: Event) -> list[Action]:
        out: list[Action] = []
        match event:
            case Arrived():
                self._arrived(event, out)
            case FromInstance(now=now, message=message):
                self._from_instance(now, message, out)
            case SendFailed():
                self.recovery.send_failed(event, out)
            case InstanceDown(now=now, instance_id=instance_id, exit_code=code):
                if self.esp is not None:
                    self.esp.instance_down(instance_id, out)
                self.router.forget(instance_id)
                if self.room is not None:
                    self.room.forget(instance_id)
                self.recovery.instance_down(now, instance_id, code, out)
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
        self._follow()
        if self.esp is not None and self.esp.groups:
            self.esp.settle_ended(out)
        return out

    def _follow(self) -> None:
        """Tell the waiting room and the prefix index what the ledger sent and ended since
        they last heard, in order. At the end of every event, and within one wherever the
        room is read after a send or an end (binding, the HP gate, the tenants' counts)."""
        if not self.ledger.changes:
            return
        room, index = self.room, self.prefix_index
        for change in self.ledger.take_changes():
            tracked = change.tracked
            if type(change) is Sent:
                if room is not None:
                    room.sent(tracked, change.target, change.submit)
                index.record(change.target, tracked.block_names)
                continue
            if room is not None:
                room.ended(tracked, change.outcome)
            if change.outcome is Outcome.COMPLETED and change.holder is not None:
                index.completed(change.holder, tracked.block_names,
                                tracked.original.prompt_token_ids, tracked.token_ids)

    def _bind(self, now: float, out: list[Action]) -> None:
        """The waiting room binds what it can."""
        if self.room is not None:
            self._apply(now, self.room.bind(now), out)

    def _apply(self, now: float, binding: Binding | None, out: list[Action]) -> None:
        """A plan of the waiting room, through the ledger: the shed end, the bound are
        sent (a rescue or a reroute is a move); the role evidence hears what it set aside."""
        if binding is None:
            return
        ledger = self.ledger
        for tracked in binding.shed:
            ledger.end(tracked, Outcome.DROPPED, EndCode.TTFT_SLO_MISSED,
                       "dropped: it was predicted to miss its TTFT SLO on every instance", out)
        for tracked, target, submit, moved in binding.bound:
            if moved:
                out.append(Moved(tracked.request_id, submit.origin, None, target))
            ledger.send_to(tracked, target, submit, out)
        self._follow()
        if binding.aside is not None and self.roles is not None:
            self.roles.set_aside(now, binding.aside)

    def _tick_roles(self, now: float, out: list[Action]) -> None:
        """`<n>A` layouts: the role component looks at its evidence; the waiting room hears
        whether arrivals come in bursts."""
        if self.roles is not None:
            self.roles.tick(now, out)
            self.room.set_bursts(self.roles.in_bursts)

    # ---- arrivals ----------------------------------------------------------------------
    def _arrived(self, event: Arrived, out: list[Action]) -> None:
        ledger, room = self.ledger, self.room
        if event.request_id in ledger.requests:
            raise ValueError(f"duplicate request id {event.request_id!r}")
        refusal = self._refusal(len(event.prompt_token_ids))
        target = None
        names, cached_on = self.prefix_index.look_up(event.prompt_token_ids)
        if refusal is None and not ledger.ready_ids():
            refusal = (Refusal.NO_INSTANCE, "no instance is ready; try again shortly")
        elif refusal is None and room is None:
            in_flight = ledger.in_flight()
            if event.model:  # multiplexed instances: keep a model's requests together
                in_flight = model_affine_loads(in_flight, ledger.models_held(), event.model)
            target, _ = self.router.route_new(ledger.ready_ids(), in_flight, cached_on)
        if refusal is not None:
            out.append(Refuse(event.request_id, *refusal, retry_after(self.slo.ttft_slo)))
            return
        now, ttft_slo = event.now, event.ttft_slo or self.slo.ttft_slo
        submit = Submit(request_id=event.request_id, prompt_token_ids=event.prompt_token_ids,
                        sampling=event.sampling, arrival_time=now, deadline=now + ttft_slo,
                        ttft_slo=ttft_slo, tbt_slo=event.tbt_slo or self.slo.tbt_slo,
                        priority=event.priority, model=event.model)
        group = (self.esp.plan(now, submit, room.backlog_seconds if room is not None else None)
                 if self.esp is not None else None)
        state = RequestState.QUEUED if room is None else RequestState.PENDING
        tracked = Tracked(event.request_id, now, submit, submit, state=state,
                          block_names=names, cached_on=cached_on, tenant=event.tenant)
        if group is not None:   # prefilled over several instances, bound at once
            if room is not None:
                room.bound_elsewhere(tracked)
            ledger.add(tracked)
            self.queue_ttl.arrived(tracked, event.ttl, out)
            self.esp.start(tracked, *group, out)
            return
        if room is None:
            ledger.add(tracked)
            self.queue_ttl.arrived(tracked, event.ttl, out)
            ledger.send_to(tracked, target, submit, out)
            return
        binding = room.arrived(tracked, now, out)   # it waits; a plan decides what goes
        ledger.add(tracked)
        self.queue_ttl.arrived(tracked, event.ttl, out)
        self._apply(now, binding, out)
        if self.roles is not None:
            self.roles.arrived(now, ttft_slo)
            self._tick_roles(now, out)

    def _refusal(self, num_tokens: int) -> tuple[Refusal, str] | None:
        if self.draining:
            return Refusal.SHUTTING_DOWN, "the server is shutting down and accepts no new requests"
        if not self.accepting:
            return Refusal.STARTING, "the server is starting; try again shortly"
        full = self.ledger.bounds.refusal(num_tokens)
        return (Refusal.QUEUE_FULL, full) if full is not None else None

    # ---- messages from instances -------------------------------------------------------
    def _from_instance(self, now: float, message, out: list[Action]) -> None:
        ledger, room = self.ledger, self.room
        if isinstance(message, Ready):
            self._ready(now, message, out)
            self._follow()
            self._bind(now, out)
            return
        view = ledger.instances.get(message.instance_id)
        if isinstance(message, InstanceFailed) or view is None or view.ready is None:
            # InstanceFailed: its exit follows. Not ready: the last words of a process that
            # has died since (its requests have moved on) -- nothing of it reaches them.
            return
        match message:
            case StepOutputs(tokens=tokens, load=load):
                ledger.found_cached(view, message.cached)
                if message.admitted:
                    ledger.admitted(view, message.admitted, now - message.step_seconds)
                self._tokens(now, view, tokens, out)
                if load is not None:
                    view.reported(load.num_running, load.num_kv_blocks_used)
                if room is not None and load is not None:
                    room.reported(view.instance_id, load)
                    self._bind(now, out)
                self._tick_roles(now, out)
            case Heartbeat():
                ledger.heartbeat(view, message)
            case Offload():
                self._offloaded(now, view, message, out)
            case Handoff():
                self.handoffs.handed_off(now, view, message, out)
            case RoleChanged():
                if self.roles is not None:
                    self._role_changed(now, view, message, out)
            case EspJoined():
                if self.esp is not None:
                    self.esp.joined(message, out)
            case Ticket(instance_id=instance_id):
                if self.router.ticket(instance_id):
                    out.append(TicketOpened(instance_id))
                    self._bind(now, out)
            case Finished(request_id=request_id, reason=reason):
                tracked = ledger.held(request_id, view)
                if tracked is not None:
                    self._finished_early(tracked, reason, out)
            case RequestError(request_id=request_id, message=text):
                tracked = ledger.held(request_id, view)
                if tracked is not None:
                    ledger.end(tracked, Outcome.REJECTED, EndCode.INVALID, text, out)
            case _:
                raise TypeError(f"not an instance message: {message!r}")

    def _role_changed(self, now: float, view: InstanceView, message: RoleChanged,
                      out: list[Action]) -> None:
        """The instance serves in its new role: what it gave back waits in the waiting
        room again, its backlog is what it reported without them, and binding goes on."""
        room = self.room
        for tracked in self.roles.changed(now, view, message, out):
            room.add(tracked, again=True)
        if message.load is not None:
            room.reported(view.instance_id, message.load)
        self._bind(now, out)

    def _ready(self, now: float, ready: Ready, out: list[Action]) -> None:
        if self.ledger.ready(ready) is None:
            return  # a ghost: no instance of the layout has that id
        self.prefix_index.ready(ready)
        if self.roles is not None:
            self.roles.ready(now, ready)
        if self.room is not None:
            self.room.ready(ready)
        out.append(InstanceReady(ready))
        self.recovery.place_moving(out)

    def _tokens(self, now: float, view: InstanceView, tokens: StepTokens,
                out: list[Action]) -> None:
        """A step's tokens, in order, passed on as one `Tokens` action ahead of what they
        cause (the `Settle` of a request that got its last). The commonest case -- a
        streaming request's next token, not its last -- is written out here (one per token
        of every request: the controller's hot path); the rest go through `_token`."""
        if not tokens:
            return
        room = self.room   # its fair shares count tokens, with two tenants or more
        counting = room is not None and room.counts_tokens
        request_ids, token_ids, finished = tokens.request_ids, tokens.token_ids, tokens.finished
        ttfts: dict[int, float] = {}
        tbts: list[float] = []
        add_tbt, skipped, at = tbts.append, [], len(out)
        # each token's request if `view` holds it, looked up as the loop reaches it (a
        # token the long way may end its request)
        for i, tracked in enumerate(map(view.held.get, request_ids)):
            if tracked is None or tracked.first_token_time is None or i in finished:
                times = self._token(now, view, request_ids[i], token_ids[i], finished.get(i),
                                    out)
                if times is None:
                    skipped.append(i)
                elif times[0] is not None:
                    ttfts[i - len(skipped)] = times[0]   # its place among the tokens kept
                else:
                    add_tbt(times[1])
                continue
            add_tbt(now - tracked.last_token_time)
            tracked.last_token_time = now
            tracked.token_ids.append(token_ids[i])
            if counting:
                room.computed(tracked, 1)
        if skipped:
            gone = set(skipped)
            tokens = tokens.only(i for i in range(len(tokens)) if i not in gone)
        if tokens:
            out.insert(at, Tokens(tokens, ttfts, tbts))

    def _token(self, now: float, view: InstanceView, request_id: str, token_id: int,
               reason: FinishReason | None, out: list[Action],
               ) -> tuple[float | None, float | None] | None:
        """One token the long way (a first or last token, or one of a request no longer
        held): its (ttft, tbt), or None when it is not passed on."""
        ledger, room = self.ledger, self.room
        tracked = ledger.held(request_id, view)
        if tracked is None:
            return None  # settled already (a client that left: its abort is on its way)
        ttft = tbt = None
        if tracked.first_token_time is None:
            ledger.unqueue(tracked)
            tracked.first_token_time, ttft = now, now - tracked.arrival_time
            if self.roles is not None:  # roles change: which one it was served in
                tracked.served_as = view.role
            tracked.advance(Trigger.FIRST_TOKEN)
            if room is not None:
                room.answered(tracked, met=now <= tracked.submit.deadline)
                room.computed(tracked, len(tracked.submit.prompt_token_ids)
                              - tracked.num_cached_tokens + 1)
        else:
            tbt = now - tracked.last_token_time
            if room is not None:
                room.computed(tracked, 1)
        tracked.last_token_time = now
        tracked.token_ids.append(token_id)
        if reason is not None:
            ledger.end(tracked, Outcome.COMPLETED, None, "", out)
            self._follow()   # its tenant's count, before the step's next tokens count
        return ttft, tbt

    def _finished_early(self, tracked: Tracked, reason: FinishReason, out: list[Action]) -> None:
        if reason is FinishReason.DROP:
            self.ledger.end(tracked, Outcome.DROPPED, EndCode.TTFT_SLO_MISSED,
                            "dropped: the request could no longer meet its TTFT SLO "
                            f"({reason.value})", out)
        else:
            self.ledger.end(tracked, Outcome.ERRORED, EndCode.ENDED_EARLY,
                            f"the request ended early on its instance ({reason.value})", out)

    def _offloaded(self, now: float, view: InstanceView, message: Offload,
                   out: list[Action]) -> None:
        """LP -> controller -> HP: prompt tokens only, same arrival and deadline. With late
        binding and the HP gate, only to an HP that can still finish it in time (else it
        waits in the waiting room again); without, to the HP with the shortest queue. With
        no HP ready, back to the least loaded ready instance, pinned there
        (`reroute_offload`)."""
        ledger, room = self.ledger, self.room
        for moved in message.requests:
            tracked = ledger.held(moved.request_id, view)
            if tracked is None:
                continue  # the client left meanwhile
            ledger.release(tracked)
            submit = msgspec.structs.replace(tracked.submit, origin=Origin.OFFLOAD,
                                             prompt_token_ids=moved.prompt_token_ids)
            ready = ledger.ready_ids()
            if room is not None and self.config.hp_gate:
                target = room.gated_hp(now, submit, tracked.cached_on)
                if target is None:
                    room.requeue(tracked)
                    continue
                if self.roles is not None:
                    self.roles.took_offload(now, target)
            else:
                target = self.router.route_offload(ready, ledger.queued())
            if target is None:
                submit = reroute_offload(submit)
                target = recovery_target(ready, ledger.role_of, ledger.queued(), ledger.in_flight())
            if target is None:
                ledger.end(tracked, Outcome.ERRORED, EndCode.UNAVAILABLE,
                           "offloaded, but no instance is ready", out)
                self._follow()
                continue
            tracked.advance(Trigger.OFFLOADED)
            ledger.send_to(tracked, target, submit, out)
            self._follow()   # the next one's HP gate counts this one's backlog
            out.append(Moved(tracked.request_id, submit.origin, view.instance_id, target))
        self._bind(now, out)

    # ---- clients, timers ---------------------------------------------------------------
    def _client_left(self, request_id: str, outcome: Outcome, out: list[Action]) -> None:
        tracked = self.ledger.requests.get(request_id)
        if tracked is None:
            return  # it ended while the driver's word was on its way
        holder = tracked.instance
        self.ledger.end(tracked, outcome, None, "", out)
        if holder is not None:  # None: between instances, held by none
            out.append(Send(holder, Abort(request_id=request_id)))

    def _end_overdue(self, now: float, out: list[Action]) -> None:
        """What waited too long for a first token ends now (503); an instance that holds
        one is told to abort it. The waiting room looks again while any request waits."""
        ledger, multiple = self.ledger, self.config.max_wait_slo_multiple
        for tracked in self.room.overdue(now):
            holder = tracked.instance   # None: still in the waiting room
            ledger.end(tracked, Outcome.DROPPED, EndCode.TTFT_SLO_MISSED,
                       f"dropped: it waited {now - tracked.arrival_time:.1f} s for its first "
                       f"token, about {multiple:g} times its TTFT SLO", out)
            if holder is not None:
                out.append(Send(holder, Abort(request_id=tracked.request_id)))
        self.room.look_again(now, ledger.bounds.requests > 0, out)

    def _timer_fired(self, now: float, timer: Timer, out: list[Action]) -> None:
        if timer.kind == RECOVERY:
            self.recovery.give_up(now, out)
        elif timer.kind == OVERDUE and self.room is not None:
            self._end_overdue(now, out)
        elif timer.kind == TTL:
            self.queue_ttl.end_expired(now, out)
        elif timer.kind == DRAIN:
            for tracked in list(self.ledger.requests.values()):
                self.ledger.end(tracked, Outcome.ERRORED, EndCode.SHUTTING_DOWN,
                                "the server is shutting down and this request did not finish "
                                f"within the drain timeout ({self.drain_timeout:g} s)", out)
        else:
            raise ValueError(f"unknown timer {timer!r}")
