"""The controller: owns every request from arrival to its last byte.

It routes each request to an instance, forwards the instances' tokens to the
request's handle (the HTTP handler reads from there), aborts what clients leave,
and settles the requests of an instance that dies. One asyncio task reads the
instances' socket; everything else runs in the HTTP handlers' tasks.
"""
from __future__ import annotations

import asyncio
import logging
import time

import msgspec

from daemon.errors import ApiError
from daemon.metrics import Metrics
from daemon.request_handle import RequestHandle
from policies.router import Router
from daemon.supervisor import InstanceSlot, InstanceState, Supervisor
from engines.instance_config import InstanceConfig
from ipc.channel import ControllerChannel, InstanceUnreachable
from ipc.messages import (
    Abort, Finished, Heartbeat, InstanceFailed, Offload, Ready, RequestError, Shutdown,
    StepOutputs, Submit, Ticket, TokenOutput,
)
from ipc.params import SamplingParams
from policies.admission import DROP_REASON

log = logging.getLogger(__name__)


class Controller:
    def __init__(self, channel: ControllerChannel, configs: list[InstanceConfig], *,
                 tokenizer, model_name: str, ttft_slo: float, tbt_slo: float,
                 backoff_max: float = 30.0, clock=time.monotonic) -> None:
        self.channel = channel
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.model_name = model_name
        self.ttft_slo, self.tbt_slo = ttft_slo, tbt_slo
        self.clock = clock
        self.metrics = Metrics()
        self.supervisor = Supervisor(configs, self._instance_exited, backoff_max)
        self.router = Router({c.instance_id: c.resolved_role for c in configs})
        self.requests: dict[str, RequestHandle] = {}
        self.accepting = False
        self._reader: asyncio.Task | None = None

    # ---- lifecycle ---------------------------------------------------------------------
    async def start(self, timeout: float = 600.0) -> None:
        self._reader = asyncio.create_task(self._read_instances())
        await self.supervisor.start(timeout)
        self.accepting = True

    async def drain(self, timeout: float) -> None:
        """Stop admitting; wait up to `timeout` for requests in flight, then end the rest."""
        self.accepting = False
        deadline = self.clock() + timeout
        while self.requests and self.clock() < deadline:
            await asyncio.sleep(0.05)
        for handle in list(self.requests.values()):
            self._settle(handle, ApiError(503, "the server is shutting down", "shutting_down"))

    async def stop(self) -> None:
        for instance_id in self.supervisor.ready_ids():
            try:
                await self.channel.send(instance_id, Shutdown())
            except InstanceUnreachable:
                pass
        await self.supervisor.stop()
        if self._reader:
            self._reader.cancel()
        self.channel.close()

    @property
    def max_model_len(self) -> int:
        lens = [s.ready.max_model_len for s in self.supervisor.slots.values() if s.ready]
        return min(lens) if lens else 0

    # ---- requests ----------------------------------------------------------------------
    async def submit(self, prompt_token_ids: list[int], sampling: SamplingParams, *, request_id: str,
                     ttft_slo: float | None = None, tbt_slo: float | None = None,
                     priority: int = 0) -> RequestHandle:
        """Route a request to an instance; its tokens then arrive on the returned handle."""
        if not self.accepting:
            raise ApiError(503, "the server is not accepting requests (starting or shutting down)",
                           "unavailable")
        instance_id, _via_ticket = self.router.route_new(self.supervisor.ready_ids(),
                                                         self._in_flight())
        if instance_id is None:
            raise ApiError(503, "no instance is ready; try again shortly", "unavailable")
        now = self.clock()
        handle = RequestHandle(request_id, now, self._client_closed)
        self.requests[request_id] = handle
        ttft_slo = ttft_slo or self.ttft_slo
        handle.submit = Submit(
            request_id=request_id, prompt_token_ids=prompt_token_ids, sampling=sampling,
            arrival_time=now, deadline=now + ttft_slo, ttft_slo=ttft_slo,
            tbt_slo=tbt_slo or self.tbt_slo, priority=priority)
        await self._send_to(instance_id, handle, handle.submit)
        return handle

    async def _send_to(self, instance_id: int, handle: RequestHandle, submit: Submit) -> None:
        handle.instance = instance_id
        try:
            await self.channel.send(instance_id, submit)
        except InstanceUnreachable as exc:
            self._settle(handle, ApiError(503, f"instance {instance_id} is unreachable: {exc}"))

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
        asyncio.ensure_future(self._send_abort(handle.instance, handle.request_id))

    async def _send_abort(self, instance_id: int, request_id: str) -> None:
        try:
            await self.channel.send(instance_id, Abort(request_id=request_id))
        except InstanceUnreachable:
            pass  # it died: its requests were settled when it did

    def _settle(self, handle: RequestHandle, error: ApiError | None, outcome: str = "") -> None:
        """A request's last word: remove it and count its outcome."""
        if self.requests.pop(handle.request_id, None) is None:
            return
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
        if isinstance(message, StepOutputs):
            now = self.clock()
            for output in message.outputs:
                self._token(output, now)
        elif isinstance(message, Heartbeat):
            self._heartbeat(message)
        elif isinstance(message, Ready):
            self.supervisor.mark_ready(message)
        elif isinstance(message, Offload):
            asyncio.ensure_future(self._forward_offloads(message))
        elif isinstance(message, Ticket):
            if self.router.ticket(message.instance_id):
                self.metrics.tickets.inc()
        elif isinstance(message, Finished):
            handle = self.requests.get(message.request_id)
            if handle is not None:
                self._finished_early(handle, message.reason)
        elif isinstance(message, RequestError):
            handle = self.requests.get(message.request_id)
            if handle is not None:
                self._settle(handle, ApiError(400, message.message), "rejected")
        elif isinstance(message, InstanceFailed):
            log.error("instance %d failed: %s", message.instance_id, message.message)

    def _finished_early(self, handle: RequestHandle, reason: str) -> None:
        if reason == DROP_REASON:
            self.metrics.dropped.labels(reason).inc()
            error = ApiError(503, "dropped: the request could no longer meet its TTFT SLO "
                                  f"({reason})", reason)
        else:
            error = ApiError(503, f"the request ended early on its instance ({reason})")
        self._settle(handle, error, "dropped" if reason == DROP_REASON else reason)

    async def _forward_offloads(self, message: Offload) -> None:
        """LP -> controller -> HP: resubmit prompt tokens only, same arrival and deadline."""
        for moved in message.requests:
            handle = self.requests.get(moved.request_id)
            if handle is None:
                continue  # the client left meanwhile
            hp = self.router.route_offload(self.supervisor.ready_ids(),
                                           self._in_flight(waiting_only=True))
            if hp is None:
                self._settle(handle, ApiError(503, "offloaded, but no HP instance is ready"),
                             "errored")
                continue
            self.metrics.offloads.inc()
            handle.offloaded = True
            handle.submit = msgspec.structs.replace(
                handle.submit, prompt_token_ids=moved.prompt_token_ids, offloaded=True)
            await self._send_to(hp, handle, handle.submit)

    def _token(self, output: TokenOutput, now: float) -> None:
        handle = self.requests.get(output.request_id)
        if handle is None:
            return  # already settled (e.g. a client that left); its abort is on its way
        previous = handle.last_token_time
        handle.put(output, now)
        self.metrics.output_tokens.inc()
        if previous is None:
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
        lost = [h for h in self.requests.values() if h.instance == slot.instance_id]
        for handle in lost:
            self._settle(handle, ApiError(503, f"instance {slot.instance_id} stopped (exit code "
                                               f"{code}) while serving this request; retry it",
                                          "instance_failed"))

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
                "instances": instances}
