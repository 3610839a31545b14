"""The instance process's loop: the engine loop wrapped in its socket shell.

    send Ready
    loop:
        drain commands       # without blocking while there is work; blocking (with a
                             # timeout, for heartbeats and liveness checks) when idle
        engine.step()        # if there is work
        send StepOutputs     # ONE message per step with every new token of that step
        heartbeat, liveness  # periodic Heartbeat; exit if the controller is gone

Every Submit gets exactly one terminal answer (see ipc.messages): a finishing
TokenOutput, Finished("abort"), or RequestError for a request the engine refuses.
Exit codes: 0 after Shutdown, 1 after an unexpected error (InstanceFailed sent first),
3 when the controller is gone (parent changed, or no message within controller_timeout).
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from engines.engine import Engine
from engines.instance_config import InstanceConfig
from engines.request import FinishReason
from ipc.channel import InstanceChannel
from ipc.messages import (
    Abort, Finished, Heartbeat, InstanceFailed, Offload, OffloadedRequest, Ping, Ready,
    RequestError, Shutdown, StepOutputs, Submit, Ticket, ToInstance,
)
from policies.admission import TICKET_BATCH_LIMIT, ticket_wanted

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONTROLLER_LOST = 3
#: Longest idle wait between liveness checks, seconds.
LIVENESS_CHECK_INTERVAL = 0.25


class Instance:
    def __init__(self, config: InstanceConfig, engine: Engine, channel: InstanceChannel,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.engine = engine
        self.channel = channel
        self.clock = clock
        self.instance_id = config.instance_id
        self.parent_pid = config.parent_pid if config.parent_pid is not None else os.getppid()
        self.num_steps = 0
        self.num_finished = self.num_offloaded = self.num_dropped = 0
        self.ticket_open = False  # HP: a Ticket was sent and no request has come since
        self._exit_code: int | None = None
        now = clock()
        self._next_heartbeat = now + config.heartbeat_interval
        self._last_command = now

    # ---- the loop ----------------------------------------------------------------------
    def run(self) -> int:
        """Serve until Shutdown or the controller goes away; returns the exit code."""
        self.channel.send(self.ready())
        try:
            while self._exit_code is None:
                self._serve_once()
        except Exception as exc:  # the engine is in an unknown state: say so and exit
            log.exception("instance %d failed", self.instance_id)
            self.channel.send(InstanceFailed(instance_id=self.instance_id,
                                             message=f"{type(exc).__name__}: {exc}"))
            return EXIT_FAILED
        return self._exit_code

    def _serve_once(self) -> None:
        busy = self.engine.has_work
        commands = self.channel.drain(0.0 if busy else self._idle_timeout())
        if commands:
            self._last_command = self.clock()
        for command in commands:
            self.handle(command)
            if self._exit_code is not None:
                return
        if self.engine.has_work:
            self._step()
        if self.config.resolved_role == "hp":
            self._maybe_ask_for_work()
        self._housekeeping()

    def _idle_timeout(self) -> float:
        now = self.clock()
        wait = min(self._next_heartbeat - now, LIVENESS_CHECK_INTERVAL)
        if self.config.controller_timeout > 0:
            wait = min(wait, self._last_command + self.config.controller_timeout - now)
        return max(0.0, wait)

    def _step(self) -> None:
        start = self.clock()
        result = self.engine.step()
        end = self.clock()
        self.num_steps += 1
        if result.outputs:
            self.num_finished += sum(1 for o in result.outputs if o.finish_reason is not None)
            self.channel.send(StepOutputs(instance_id=self.instance_id, step=self.num_steps,
                                          time=end, step_time=end - start, outputs=result.outputs))
        if result.offloaded:
            self.num_offloaded += len(result.offloaded)
            self.channel.send(Offload(instance_id=self.instance_id, requests=[
                OffloadedRequest(r.request_id, r.prompt_token_ids) for r in result.offloaded]))
        for request in result.dropped:
            self.num_dropped += 1
            self.channel.send(Finished(instance_id=self.instance_id, request_id=request.request_id,
                                       reason=FinishReason.DROP.value))

    def _maybe_ask_for_work(self) -> None:
        """HP: with nothing waiting and room in batch and KV, hold one ticket (paper §6.1)."""
        scheduler, kv = self.engine.scheduler, self.engine.kv
        if ticket_wanted(len(scheduler.waiting), len(scheduler.running), TICKET_BATCH_LIMIT,
                         kv.num_free_blocks / kv.num_blocks, self.ticket_open):
            self.ticket_open = True
            self.channel.send(Ticket(instance_id=self.instance_id))

    def _housekeeping(self) -> None:
        now = self.clock()
        if now >= self._next_heartbeat:
            self.channel.send(self.heartbeat())
            self._next_heartbeat = now + self.config.heartbeat_interval
        if os.getppid() != self.parent_pid:
            log.warning("instance %d: parent %d is gone; exiting",
                        self.instance_id, self.parent_pid)
            self._exit_code = EXIT_CONTROLLER_LOST
        elif 0 < self.config.controller_timeout <= now - self._last_command:
            log.warning("instance %d: no message from the controller for %.1f s; exiting",
                        self.instance_id, now - self._last_command)
            self._exit_code = EXIT_CONTROLLER_LOST

    # ---- commands ----------------------------------------------------------------------
    def handle(self, command: ToInstance) -> None:
        if isinstance(command, Submit):
            self._submit(command)
        elif isinstance(command, Abort):
            self._abort(command.request_id)
        elif isinstance(command, Ping):
            self.channel.send(self.heartbeat(ping_id=command.ping_id))
        elif isinstance(command, Shutdown):
            self._shutdown()

    def _submit(self, submit: Submit) -> None:
        if not (submit.offloaded or submit.preempted):
            self.ticket_open = False  # a new request came: it used our ticket (or beat it)
        deadline = submit.deadline
        if deadline is None:
            deadline = (submit.arrival_time + submit.ttft_slo if submit.ttft_slo is not None
                        else float("inf"))
        try:
            self._check_token_ids(submit.prompt_token_ids)
            self.engine.add_request(submit.prompt_token_ids, submit.sampling,
                                    request_id=submit.request_id,
                                    arrival_time=submit.arrival_time,
                                    deadline=deadline, priority=submit.priority,
                                    tbt_slo=submit.tbt_slo or float("inf"),
                                    offloaded=submit.offloaded, preempted=submit.preempted)
        except ValueError as exc:
            log.info("instance %d refused request %s: %s", self.instance_id, submit.request_id, exc)
            self.channel.send(RequestError(instance_id=self.instance_id,
                                           request_id=submit.request_id, message=str(exc)))

    def _check_token_ids(self, token_ids: list[int]) -> None:
        """Refuse ids outside the model's vocabulary (an executor may publish `vocab_size`)."""
        vocab_size = getattr(self.engine.executor, "vocab_size", None)
        if vocab_size is not None and max(token_ids) >= vocab_size:
            raise ValueError(f"prompt has token id {max(token_ids)}; the vocabulary has "
                             f"{vocab_size} tokens")

    def _abort(self, request_id: str) -> None:
        """Unknown or finished ids are ignored: their terminal answer was already sent."""
        if self.engine.abort(request_id):
            self.channel.send(Finished(instance_id=self.instance_id, request_id=request_id,
                                       reason=FinishReason.ABORT.value))

    def _shutdown(self) -> None:
        for request_id in list(self.engine.scheduler.requests):
            self._abort(request_id)
        log.info("instance %d: shutting down", self.instance_id)
        self._exit_code = EXIT_OK

    # ---- reports -----------------------------------------------------------------------
    def ready(self) -> Ready:
        scheduler = self.engine.scheduler
        return Ready(instance_id=self.instance_id, role=self.config.resolved_role,
                     mode=scheduler.mode.name, executor=self.config.executor.kind,
                     pid=os.getpid(), num_kv_blocks=self.engine.kv.num_blocks,
                     block_size=self.engine.kv.block_size, max_model_len=scheduler.max_model_len)

    def heartbeat(self, ping_id: int | None = None) -> Heartbeat:
        scheduler, kv = self.engine.scheduler, self.engine.kv
        return Heartbeat(
            instance_id=self.instance_id, time=self.clock(), ping_id=ping_id,
            num_waiting=len(scheduler.waiting), num_running=len(scheduler.running),
            num_kv_blocks_used=kv.num_blocks - kv.num_free_blocks, num_kv_blocks=kv.num_blocks,
            num_preemptions=scheduler.num_preemptions, num_steps=self.num_steps,
            num_bad_frames=self.channel.num_bad_frames, num_finished=self.num_finished,
            num_offloaded=self.num_offloaded, num_dropped=self.num_dropped,
            perf_model_mape=self.engine.perf_model.mape if self.engine.perf_model else None)
