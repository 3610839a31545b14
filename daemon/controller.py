"""The controller: owns every request from arrival to its last byte.

It routes each request to an instance, forwards the instances' tokens to the
request's handle (the HTTP handler reads from there), aborts what clients leave,
and moves the requests of an instance that dies to another one (daemon/recovery.py
decides how; this only carries it out). It refuses new requests with 503 and
Retry-After while too many wait for a first token (daemon/overload.py). One asyncio
task reads the instances' socket; everything else runs in the HTTP handlers' tasks
(and in short-lived recovery tasks).
"""
from __future__ import annotations

import asyncio
import logging
import time

import msgspec

from daemon.errors import ApiError
from daemon.metrics import Metrics
from daemon.overload import QUEUE_FULL, WaitingQueue, retry_after
from daemon.recovery import recover, recovery_target, reroute_offload
from daemon.request_handle import RequestHandle
from daemon.supervisor import InstanceSlot, InstanceState, Supervisor
from engines.instance_config import InstanceConfig
from ipc.channel import ControllerChannel, InstanceUnreachable
from ipc.messages import (
    Abort, Finished, Heartbeat, InstanceFailed, Offload, Ready, RequestError, Shutdown,
    StepOutputs, Submit, Ticket, TokenOutput,
)
from ipc.params import SamplingParams
from policies.admission import DROP_REASON
from policies.router import Router

log = logging.getLogger(__name__)


class Controller:
    def __init__(self, channel: ControllerChannel, configs: list[InstanceConfig], *,
                 tokenizer, model_name: str, ttft_slo: float, tbt_slo: float,
                 backoff_max: float = 30.0, max_queued_requests: int = 1024,
                 max_queued_tokens: int = 1 << 20, recovery_timeout: float = 10.0,
                 clock=time.monotonic) -> None:
        self.channel = channel
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.model_name = model_name
        self.ttft_slo, self.tbt_slo = ttft_slo, tbt_slo
        self.clock = clock
        self.metrics = Metrics()
        self.supervisor = Supervisor(configs, self._instance_exited, backoff_max)
        self.roles = {c.instance_id: c.resolved_role for c in configs}
        self.router = Router(self.roles)
        self.requests: dict[str, RequestHandle] = {}
        self.waiting = WaitingQueue(max_queued_requests, max_queued_tokens)
        self.recovery_timeout = recovery_timeout
        self.accepting = False
        self.draining = False
        self._reader: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()  # recoveries, offload forwards, aborts

    # ---- lifecycle ---------------------------------------------------------------------
    async def start(self, timeout: float = 600.0) -> None:
        self._reader = asyncio.create_task(self._read_instances())
        await self.supervisor.start(timeout)
        self.accepting = True

    async def drain(self, timeout: float) -> None:
        """Stop admitting; wait up to `timeout` for requests in flight, then end the rest."""
        self.accepting, self.draining = False, True
        deadline = self.clock() + timeout
        while self.requests and self.clock() < deadline:
            await asyncio.sleep(0.05)
        error = ApiError(503, "the server is shutting down and this request did not finish "
                              f"within the drain timeout ({timeout:g} s)", "shutting_down")
        for handle in list(self.requests.values()):
            self._settle(handle, error)

    async def stop(self) -> None:
        for instance_id in self.supervisor.ready_ids():
            try:
                await self.channel.send(instance_id, Shutdown())
            except InstanceUnreachable:
                pass
        await self.supervisor.stop()
        if self._reader:
            self._reader.cancel()
        for task in list(self._tasks):
            task.cancel()
        self.channel.close()

    def _spawn(self, coro) -> None:
        """Run `coro` as a task the controller owns (kept referenced; cancelled by stop)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def max_model_len(self) -> int:
        lens = [s.ready.max_model_len for s in self.supervisor.slots.values() if s.ready]
        return min(lens) if lens else 0

    # ---- requests ----------------------------------------------------------------------
    async def submit(self, prompt_token_ids: list[int], sampling: SamplingParams, *, request_id: str,
                     ttft_slo: float | None = None, tbt_slo: float | None = None,
                     priority: int = 0) -> RequestHandle:
        """Route a request to an instance; its tokens then arrive on the returned handle.

        Refused with 503 (and Retry-After) while not accepting (starting, shutting down),
        with no instance ready, or when the waiting queue is full."""
        if self.draining:
            self._refuse("shutting_down", "the server is shutting down and accepts no new "
                                          "requests", "shutting_down")
        if not self.accepting:
            self._refuse("starting", "the server is starting; try again shortly", "unavailable")
        refusal = self.waiting.refusal(len(prompt_token_ids))
        if refusal is not None:
            self._refuse(QUEUE_FULL, refusal, QUEUE_FULL)
        instance_id, _via_ticket = self.router.route_new(self.supervisor.ready_ids(),
                                                         self._in_flight())
        if instance_id is None:
            self._refuse("no_instance", "no instance is ready; try again shortly", "unavailable")
        now = self.clock()
        handle = RequestHandle(request_id, now, self._client_closed)
        self.requests[request_id] = handle
        self._queue(handle, len(prompt_token_ids))
        ttft_slo = ttft_slo or self.ttft_slo
        handle.submit = Submit(
            request_id=request_id, prompt_token_ids=prompt_token_ids, sampling=sampling,
            arrival_time=now, deadline=now + ttft_slo, ttft_slo=ttft_slo,
            tbt_slo=tbt_slo or self.tbt_slo, priority=priority)
        try:
            await self._send_to(instance_id, handle, handle.submit)
        except Exception:  # e.g. a value the wire format cannot carry: never leave it behind
            log.exception("request %s: could not be sent to instance %d", request_id, instance_id)
            error = ApiError(500, "the request could not be handed to an instance",
                             "internal_error")
            self._settle(handle, error, "error")
            raise error from None
        return handle

    def _refuse(self, reason: str, message: str, code: str) -> None:
        self.metrics.dropped.labels(reason).inc()
        raise ApiError(503, message, code, retry_after=retry_after(self.ttft_slo))

    def _queue(self, handle: RequestHandle, num_tokens: int) -> None:
        self.waiting.add(num_tokens)
        handle.queued_tokens = num_tokens
        self._queue_gauges()

    def _unqueue(self, handle: RequestHandle) -> None:
        """It got its first token or ended: it no longer waits (once per request)."""
        if handle.queued_tokens:
            self.waiting.remove(handle.queued_tokens)
            handle.queued_tokens = 0
            self._queue_gauges()

    def _queue_gauges(self) -> None:
        self.metrics.queued_requests.set(self.waiting.requests)
        self.metrics.queued_tokens.set(self.waiting.tokens)

    async def _send_to(self, instance_id: int, handle: RequestHandle, submit: Submit) -> None:
        handle.instance = instance_id
        try:
            await self.channel.send(instance_id, submit)
        except InstanceUnreachable as exc:
            # It died and the supervisor has not noticed yet: take the request over now.
            log.warning("request %s: %s; moving it", handle.request_id, exc)
            if handle.instance == instance_id and self.requests.get(handle.request_id) is handle:
                handle.instance = None
                slot = self.supervisor.slots.get(instance_id)
                self._spawn(self._recover([handle], instance_id, slot.pid if slot else None,
                                          f"instance {instance_id} became unreachable while "
                                          "serving this request"))

    def _in_flight(self, waiting_only: bool = False) -> dict[int, int]:
        """Requests per instance (only those still waiting for a first token if asked)."""
        counts: dict[int, int] = {}
        for handle in self.requests.values():
            if handle.instance is not None and not (waiting_only and handle.first_token_time):
                counts[handle.instance] = counts.get(handle.instance, 0) + 1
        return counts

    def _client_closed(self, handle: RequestHandle, outcome: str) -> None:
        """The HTTP side is done with a request; abort it on its instance if still running.

        The request is settled now; the instance's Finished("abort") then finds nothing.
        """
        if handle.finished or handle.request_id not in self.requests:
            return
        self._settle(handle, None, outcome)
        if handle.instance is not None:  # None: between instances, held by none
            self._spawn(self._send_abort(handle.instance, handle.request_id))

    async def _send_abort(self, instance_id: int, request_id: str) -> None:
        try:
            await self.channel.send(instance_id, Abort(request_id=request_id))
        except InstanceUnreachable:
            pass  # it died: it holds nothing any more

    def _settle(self, handle: RequestHandle, error: ApiError | None, outcome: str = "") -> None:
        """A request's last word: remove it and count its outcome."""
        if self.requests.pop(handle.request_id, None) is None:
            return
        self._unqueue(handle)
        if error is not None:
            handle.fail(error)
        if handle.first_token_time is not None and handle.last_token_time is not None:
            self.metrics.e2e.observe(handle.last_token_time - handle.arrival_time)
        self.metrics.requests.labels(outcome or ("error" if error else "completed")).inc()

    # ---- messages from instances --------------------------------------------------------
    async def _read_instances(self) -> None:
        async for message in self.channel:
            try:
                self._dispatch(message)
            except Exception:  # one bad message must not stop the reader
                log.exception("controller: failed to handle %r", message)

    def _dispatch(self, message) -> None:
        if isinstance(message, Ready):
            self.supervisor.mark_ready(message)
            return
        if isinstance(message, InstanceFailed):
            log.error("instance %d failed: %s", message.instance_id, message.message)
            return
        if not self._live(message.instance_id):
            # The last words of a process that has died since (its requests have moved
            # on), or a process not yet Ready: nothing of it may reach a request now.
            return
        if isinstance(message, StepOutputs):
            now = self.clock()
            for output in message.outputs:
                self._token(output, now, message.instance_id)
        elif isinstance(message, Heartbeat):
            self._heartbeat(message)
        elif isinstance(message, Offload):
            self._spawn(self._forward_offloads(message))
        elif isinstance(message, Ticket):
            if self.router.ticket(message.instance_id):
                self.metrics.tickets.inc()
        elif isinstance(message, Finished):
            handle = self._held(message.request_id, message.instance_id)
            if handle is not None:
                self._finished_early(handle, message.reason)
        elif isinstance(message, RequestError):
            handle = self._held(message.request_id, message.instance_id)
            if handle is not None:
                self._settle(handle, ApiError(400, message.message), "rejected")

    def _live(self, instance_id: int) -> bool:
        slot = self.supervisor.slots.get(instance_id)
        return slot is not None and slot.state is InstanceState.READY

    def _held(self, request_id: str, instance_id: int) -> RequestHandle | None:
        """The request's handle if `instance_id` holds it now (not a former holder)."""
        handle = self.requests.get(request_id)
        return handle if handle is not None and handle.instance == instance_id else None

    def _finished_early(self, handle: RequestHandle, reason: str) -> None:
        if reason == DROP_REASON:
            self.metrics.dropped.labels(reason).inc()
            error = ApiError(503, "dropped: the request could no longer meet its TTFT SLO "
                                  f"({reason})", reason)
        else:
            error = ApiError(503, f"the request ended early on its instance ({reason})")
        self._settle(handle, error, "dropped" if reason == DROP_REASON else reason)

    async def _forward_offloads(self, message: Offload) -> None:
        """LP -> controller -> HP: resubmit prompt tokens only, same arrival and deadline.

        With no HP ready (one died and restarts), the request goes back to the least
        loaded ready instance, marked so that it stays there (recovery.reroute_offload)."""
        for moved in message.requests:
            handle = self._held(moved.request_id, message.instance_id)
            if handle is None:
                continue  # the client left meanwhile
            submit = msgspec.structs.replace(
                handle.submit, prompt_token_ids=moved.prompt_token_ids, offloaded=True)
            ready = self.supervisor.ready_ids()
            target = self.router.route_offload(ready, self._in_flight(waiting_only=True))
            if target is None:
                target = recovery_target(ready, self.roles, self._in_flight(waiting_only=True),
                                         self._in_flight())
                submit = reroute_offload(submit)
                if target is None:
                    self._settle(handle, ApiError(503, "offloaded, but no instance is ready",
                                                  "unavailable"), "error")
                    continue
                self.metrics.recovered.labels("reroute").inc()
            else:
                self.metrics.offloads.inc()
            handle.offloaded = True
            handle.submit = submit
            await self._send_to(target, handle, submit)

    def _token(self, output: TokenOutput, now: float, instance_id: int) -> None:
        handle = self._held(output.request_id, instance_id)
        if handle is None:
            return  # already settled (e.g. a client that left; its abort is on its way)
        previous = handle.last_token_time
        handle.put(output, now)
        self.metrics.output_tokens.inc()
        if previous is None:
            self._unqueue(handle)
            self.metrics.ttft.observe(now - handle.arrival_time)
        else:
            self.metrics.tbt.observe(now - previous)
        if output.finish_reason is not None:
            slot = self.supervisor.slots.get(handle.instance)
            role = slot.config.resolved_role if slot else "?"
            self.metrics.served.labels(str(handle.instance), role).inc()
            self._settle(handle, None, "completed")

    def _heartbeat(self, beat: Heartbeat) -> None:
        slot = self.supervisor.slots.get(beat.instance_id)
        if slot is None or slot.state is not InstanceState.READY:
            return  # e.g. the last words of a process that has died since (Ready comes first)
        slot.stats = beat
        name = str(beat.instance_id)
        self.metrics.waiting.labels(name).set(beat.num_waiting)
        self.metrics.running.labels(name).set(beat.num_running)
        self.metrics.kv_usage.labels(name).set(beat.num_kv_blocks_used / max(beat.num_kv_blocks, 1))
        self.metrics.preemptions.labels(name).set(beat.num_preemptions)
        if beat.perf_model_mape is not None:
            self.metrics.perf_model_mape.labels(name).set(beat.perf_model_mape)

    def _instance_exited(self, slot: InstanceSlot, code: int) -> None:
        name = str(slot.instance_id)
        self.metrics.restarts.labels(name).inc()
        for gauge in (self.metrics.waiting, self.metrics.running, self.metrics.kv_usage):
            gauge.labels(name).set(0)
        self.router.forget(slot.instance_id)
        held = [h for h in self.requests.values() if h.instance == slot.instance_id]
        for handle in held:
            handle.instance = None  # between instances: held by none until moved
        if held:
            log.warning("instance %d stopped holding %d requests; moving them",
                        slot.instance_id, len(held))
            self._spawn(self._recover(held, slot.instance_id, slot.pid,
                                      f"instance {slot.instance_id} stopped (exit code {code}) "
                                      "while serving this request"))

    async def _recover(self, handles: list[RequestHandle], dead: int, dead_pid: int | None,
                       why: str) -> None:
        """Move each request that instance `dead` (process `dead_pid`) held to a ready
        instance (resubmit or resume, as daemon/recovery.py plans); end those it cannot,
        with `why` in the message. Waits up to `recovery_timeout` for an instance to be
        ready -- the dead one counts once it runs as a new process (restarted)."""
        deadline = self.clock() + self.recovery_timeout
        pending = handles
        while True:
            pending = [h for h in pending if self.requests.get(h.request_id) is h
                       and h.instance is None]  # not settled (a client that left) meanwhile
            waiting = []
            slot = self.supervisor.slots.get(dead)
            exclude = dead if slot is None or slot.pid == dead_pid else None
            ready = self.supervisor.ready_ids()
            queued, in_flight = self._in_flight(waiting_only=True), self._in_flight()
            for handle in pending:
                if self.requests.get(handle.request_id) is not handle:
                    continue  # the client left while an earlier one was being sent
                target = recovery_target(ready, self.roles, queued, in_flight, exclude=exclude)
                if target is None:
                    waiting.append(handle)
                    continue
                in_flight[target] = in_flight.get(target, 0) + 1
                if not handle.token_ids:
                    queued[target] = queued.get(target, 0) + 1
                plan = recover(handle.submit, handle.token_ids,
                               self.supervisor.slots[target].ready.max_model_len)
                if plan.error is not None:
                    self._settle(handle, ApiError(503, f"{why}: {plan.error}", "instance_failed"))
                    continue
                self.metrics.recovered.labels(plan.kind).inc()
                handle.num_recoveries += 1
                handle.submit = plan.submit
                log.info("request %s: %s on instance %d after %d tokens", handle.request_id,
                         plan.kind, target, len(handle.token_ids))
                await self._send_to(target, handle, plan.submit)
            pending = waiting
            if not pending:
                return
            if self.clock() >= deadline:
                break
            await asyncio.sleep(0.05)
        for handle in pending:
            self._settle(handle, ApiError(
                503, f"{why}, and no instance could take it over within "
                     f"{self.recovery_timeout:g} s; retry it", "instance_failed"))

    # ---- health ------------------------------------------------------------------------
    def health(self) -> dict:
        instances = []
        for slot in self.supervisor.slots.values():
            beat, ready = slot.stats, slot.ready
            instances.append({
                "id": slot.instance_id, "role": slot.config.resolved_role,
                "mode": slot.config.scheduler.mode, "pid": slot.pid, "state": slot.state.value,
                "restarts": slot.restarts,
                "in_flight": sum(1 for h in self.requests.values() if h.instance == slot.instance_id),
                "waiting": beat.num_waiting if beat else 0,
                "running": beat.num_running if beat else 0,
                "kv_blocks_used": beat.num_kv_blocks_used if beat else 0,
                "kv_blocks_total": ready.num_kv_blocks if ready else 0,
                "preemptions": beat.num_preemptions if beat else 0,
                "served": beat.num_finished if beat else 0,
                "offloaded": beat.num_offloaded if beat else 0,
                "dropped": beat.num_dropped if beat else 0,
                "ticket_open": self.router.tickets.is_open(slot.instance_id),
                "perf_model_mape": beat.perf_model_mape if beat else None,
            })
        all_ready = all(i["state"] == "ready" for i in instances)
        status = "ok" if self.accepting and all_ready else (
            "draining" if not self.accepting else "degraded")
        return {"status": status, "model": self.model_name, "requests_in_flight": len(self.requests),
                "queued_requests": self.waiting.requests, "queued_tokens": self.waiting.tokens,
                "instances": instances}
