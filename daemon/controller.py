"""The controller process's driver: the controller core over asyncio, ZeroMQ and HTTP streams.

Every decision is the core's (`daemon/core/controller_core.py`). This file only turns the
world into core events -- a request from the HTTP API, a message on the instances'
socket, a process that exited, a send that failed, a timer -- stamped with
`time.monotonic()`, and carries out the actions that come back: send a message, pass
a step's tokens to their requests' streams, end a stream with its answer, start a timer.
The Prometheus metrics (`daemon/metrics.py`) observe the same actions; a `Tokens` -- one
per instance step, every token of it, the hot path -- is counted at once and each of its
tokens appended to its stream.

One asyncio task reads the instances' socket; sends run as short tasks of their own.
"""
from __future__ import annotations

import asyncio
import logging
import time

from daemon.core.controller_config import ControllerConfig, SloConfig, TenantsConfig
from daemon.core.controller_core import ControllerCore
from daemon.core.events import (
    Arrived, ClientLeft, Drain, EspChanged, FromInstance, InstanceDown, InstanceReady, Refuse,
    RoleSwitched, Send, SendFailed, Settle, StartAccepting, StartTimer, Tokens,
)
from daemon.core_timers import CoreTimers
from daemon.errors import ApiError, refusal_error, settle_error
from daemon.gateway_view import gateway_view
from daemon.health import Health, Probe, build_health, liveness, readiness
from daemon.metrics import Metrics
from daemon.request_handle import RequestHandle
from daemon.request_log import RequestLog
from daemon.core.request_state import Outcome
from daemon.supervisor import InstanceSlot, Supervisor
from engines.instance_config import InstanceConfig
from ipc.channel import ControllerChannel, InstanceUnreachable
from ipc.messages import (
    Heartbeat, InstanceFailed, Shutdown, StepTokens, SubmitPrefilled, ToInstance,
)
from ipc.params import SamplingParams
from policies.tenants import DEFAULT_TENANT

log = logging.getLogger(__name__)
#: Longest the instances' reader runs before the other tasks get a turn, seconds.
READER_SLICE = 0.02


class Controller:
    def __init__(self, channel: ControllerChannel, configs: list[InstanceConfig], *,
                 tokenizer, model_name: str, model_names: list[str] | None = None,
                 slo: SloConfig = SloConfig(),
                 controller_config: ControllerConfig = ControllerConfig(),
                 backoff_max: float = 30.0,
                 request_log: str = "", clock=time.monotonic,
                 dynamic_roles: bool = False, tenants: TenantsConfig = TenantsConfig()) -> None:
        """`dynamic_roles`: an `<n>A` layout (roles change online, docs/design.md §5.10);
        `model_names`: a multiplexed group's served names (its instances hold them all,
        engines/mux_core.py), `model_name` first; None: that one model."""
        self.channel = channel
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.model_name = model_name
        self.model_names = list(model_names or [model_name])
        self.clock = clock
        roles = {c.instance_id: c.resolved_role for c in configs}
        self.core = ControllerCore(roles, controller_config, slo, dynamic_roles=dynamic_roles,
                                   tenants=tenants, esp=controller_config.esp)
        #: What this driver, /health and /metrics read of the core.
        self.view = view = self.core.view
        self.tenants = tenants   # the HTTP side reads objective priorities here
        self.metrics = Metrics(roles, tenants)
        if view.dynamic_roles:
            self.metrics.watch_roles(lambda: view.role_seconds(self.clock()))
        self.metrics.queued_requests.set_function(lambda: view.queued_requests)
        self.metrics.queued_tokens.set_function(lambda: view.queued_tokens)
        self.metrics.watch_gateway(model_name, lambda: gateway_view(view))
        self.supervisor = Supervisor(configs, self._instance_exited, backoff_max)
        self.streams: dict[str, RequestHandle] = {}
        self.request_log = RequestLog(request_log) if request_log else None
        self._drained = asyncio.Event()
        self._reader: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()  # sends
        self.timers = CoreTimers(clock, self._handle)
        #: P/D: a Handoff's KV frames, by request id, while the core handles it (its
        #: SubmitPrefilled takes them on; never into the core).
        self._kv_frames: dict[str, list] = {}

    # ---- lifecycle ---------------------------------------------------------------------
    async def start(self, timeout: float = 600.0) -> None:
        self._reader = asyncio.create_task(self._read_instances())
        await self.supervisor.start(timeout)
        self._handle(StartAccepting(self.clock()))

    async def drain(self, timeout: float) -> None:
        """Stop admitting; wait up to `timeout` for requests in flight (the core then ends
        the rest with an error naming the drain timeout)."""
        self._handle(Drain(self.clock(), timeout))
        if self.view.requests_in_flight:
            await self._drained.wait()

    async def stop(self) -> None:
        for instance_id in self.view.ready_ids():
            try:
                await self.channel.send(instance_id, Shutdown())
            except InstanceUnreachable:
                pass
        await self.supervisor.stop()
        if self._reader:
            self._reader.cancel()
        for task in list(self._tasks):
            task.cancel()
        self.timers.cancel_all()
        self.channel.close()
        if self.request_log:
            self.request_log.close()

    @property
    def max_model_len(self) -> int:
        return self.view.max_model_len

    def health(self) -> Health:
        return build_health(self.view, self.supervisor, self.model_name, self.clock())

    def liveness(self) -> Probe:
        return liveness(self.view)

    def readiness(self) -> Probe:
        return readiness(self.view)

    # ---- requests ----------------------------------------------------------------------
    async def submit(self, prompt_token_ids: list[int], sampling: SamplingParams, *, request_id: str,
                     ttft_slo: float | None = None, tbt_slo: float | None = None,
                     priority: int = 0, tenant: str = DEFAULT_TENANT,
                     ttl: float | None = None, model: str = "") -> RequestHandle:
        """Hand a request to the core; its tokens then arrive on the returned handle.
        A refusal (starting, shutting down, queue full, no instance) raises ApiError 503.
        `ttl`: seconds it may wait to start (x-llm-d-inference-ttl); `model`: which of a
        multiplexed group's models serves it ("" = the first)."""
        arrived = Arrived(self.clock(), request_id, prompt_token_ids, sampling, ttft_slo, tbt_slo,
                          priority, tenant, ttl, model)
        if self.request_log:
            self.request_log.arrived(arrived)
        actions = self.core.handle(arrived)
        refused = next((a for a in actions if isinstance(a, Refuse)), None)
        if refused is not None:
            self.metrics.observe(refused)
            self.metrics.tenants.refused(tenant)
            if self.request_log:
                self.request_log.observe(refused)
            raise refusal_error(refused)
        handle = RequestHandle(request_id, self._client_closed)
        self.streams[request_id] = handle
        self._carry_out(actions)
        return handle

    def _client_closed(self, handle: RequestHandle, outcome: Outcome) -> None:
        self._handle(ClientLeft(self.clock(), handle.request_id, outcome))

    # ---- events in, actions out --------------------------------------------------------
    def _handle(self, event) -> None:
        self._carry_out(self.core.handle(event))

    def _carry_out(self, actions) -> None:
        request_log = self.request_log
        for action in actions:
            if request_log:
                request_log.observe(action)
            self.metrics.observe(action)
            if type(action) is Tokens:  # the hot path: a step's tokens
                self._stream(action.tokens)
                if action.ttfts:
                    self._note_queue_delays(action)
                continue
            match action:
                case Send(instance_id=instance_id, message=message):
                    # a P/D hand-off's KV frames go on as they came (never into the core)
                    frames = (self._kv_frames.pop(message.request_id, ())
                              if type(message) is SubmitPrefilled else ())
                    self._spawn(self._send(instance_id, message, frames))
                case Settle(request_id=request_id):
                    stream = self.streams.pop(request_id, None)
                    if stream is not None:
                        stream.num_cached_tokens = action.cached_tokens
                        stream.settled = action
                        if stream.queue_delay is None:
                            stream.queue_delay = action.queue_delay
                    error = settle_error(action)
                    if stream is not None and error is not None:
                        stream.fail(error)
                case StartTimer(timer=timer, at=at):
                    self.timers.start(timer, at, asyncio.get_running_loop())
                case InstanceReady(ready=ready):
                    self.supervisor.mark_ready(ready)
                    self.metrics.ready(ready)
                case RoleSwitched(instance_id=i, old=old, new=new, reason=reason):
                    log.info("instance %d changed role %s -> %s (%s); %d waiting requests "
                             "bound again", i, old.value, new.value, reason, action.returned)
                case EspChanged(request_id=request_id, members=members, formed=formed,
                                reason=reason):
                    log.info("ESP group of request %s over instances %s %s: %s", request_id,
                             list(members), "formed" if formed else "dissolved", reason)
        if self.view.draining and not self.view.requests_in_flight:
            self._drained.set()

    def _stream(self, tokens: StepTokens) -> None:
        """Each of a step's tokens to its request's stream (if its client still listens)."""
        streams = self.streams
        for i, request_id in enumerate(tokens.request_ids):
            stream = streams.get(request_id)
            if stream is not None:
                stream.put(tokens.output(i))

    def _note_queue_delays(self, action: Tokens) -> None:
        """At its first token, how long each request waited to start its prefill (the
        x-llm-d-flow-queue-duration-ms answer header, sent before the body). A request
        that ended with this token has left the core's books: its `Settle` says it."""
        ids = action.tokens.request_ids
        for position in action.ttfts:
            stream = self.streams.get(ids[position])
            delay = self.view.queue_delay(ids[position])
            if stream is not None and delay is not None:
                stream.queue_delay = delay

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, instance_id: int, message: ToInstance, frames=()) -> None:
        try:
            await self.channel.send(instance_id, message, frames)
        except InstanceUnreachable as exc:
            # It died and the supervisor has not noticed yet: the core moves what it held.
            log.warning("instance %d: %s", instance_id, exc)
            self._handle(SendFailed(self.clock(), instance_id, message, unreachable=True))
        except Exception:  # e.g. a value the wire format cannot carry: never leave it behind
            log.exception("could not send %s to instance %d", type(message).__name__, instance_id)
            self._handle(SendFailed(self.clock(), instance_id, message, unreachable=False))

    # ---- the instances' side -----------------------------------------------------------
    async def _read_instances(self) -> None:
        """Every message to the core, in order. pyzmq hands over a waiting message without
        suspending, so while messages keep coming the reader gives the other tasks (the
        streams, new requests, sends) a turn every READER_SLICE seconds."""
        slice_end = self.clock() + READER_SLICE
        async for message, frames in self.channel:
            if self.clock() >= slice_end:
                await asyncio.sleep(0)
                slice_end = self.clock() + READER_SLICE
            try:
                if isinstance(message, InstanceFailed):
                    log.error("instance %d failed: %s", message.instance_id, message.message)
                if frames:
                    self._kv_frames[message.request_id] = frames
                self._handle(FromInstance(self.clock(), message))
                if frames:  # not passed on (its client left): let them go
                    self._kv_frames.pop(message.request_id, None)
                if isinstance(message, Heartbeat):
                    view = self.view.instances.get(message.instance_id)
                    if view is not None and view.stats is message:
                        self.metrics.heartbeat(message)
            except Exception:  # one bad message must not stop the reader
                log.exception("controller: failed to handle %r", message)

    def _instance_exited(self, slot: InstanceSlot, code: int) -> None:
        held = len(self.view.instances[slot.instance_id].held)
        if held:
            log.warning("instance %d stopped holding %d requests; moving them",
                        slot.instance_id, held)
        self.metrics.instance_down(slot.instance_id)
        self._handle(InstanceDown(self.clock(), slot.instance_id, code))


__all__ = ["Controller"]
