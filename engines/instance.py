"""The instance process's driver: the instance core over a ZeroMQ socket and a real executor.

    send Ready
    loop:
        drain commands       # without blocking while there is work; blocking (with a
                             # timeout, for heartbeats and liveness checks) when idle
        step                 # core.begin_step -> executor.execute -> core.finish_step
        send what it says    # ONE StepOutputs per step, then offloads and drops
        ask for work         # HP: a Ticket when idle with room to spare
        heartbeat, liveness  # periodic Heartbeat; exit if the controller is gone

Every rule is the core's (`engines/instance_core.py`); this file times the step, moves
messages and watches its parent. Exit codes: 0 after Shutdown, 1 after an unexpected
error (InstanceFailed sent first), 3 when the controller is gone (parent changed, or
no message within controller_timeout).
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from engines.engine import Engine
from engines.instance_config import InstanceConfig
from engines.instance_core import InstanceCore
from ipc.channel import InstanceChannel
from ipc.messages import Handoff, InstanceFailed, Ready, SubmitPrefilled

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
        self.core = InstanceCore(config.instance_id, config.resolved_role, engine)
        self.engine = engine
        self.channel = channel
        self.clock = clock
        self.instance_id = config.instance_id
        self.parent_pid = config.parent_pid if config.parent_pid is not None else os.getppid()
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
        received = self.channel.drain(0.0 if self.core.has_work else self._idle_timeout())
        if received:
            self._last_command = self.clock()
        for command, frames in received:
            self.handle(command, frames)
            if self._exit_code is not None:
                return
        if self.core.has_work:
            self._step()
        self._send(self.core.ask_for_work())
        self._housekeeping()

    def handle(self, command, frames=()) -> None:
        self.core.num_bad_frames = self.channel.num_bad_frames
        if isinstance(command, SubmitPrefilled):  # its KV frames, if any came with it
            self.core.kv_in[command.request_id] = list(frames)
        self._send(self.core.handle(command, self.clock()))
        if self.core.stopped:
            log.info("instance %d: shutting down", self.instance_id)
            self._exit_code = EXIT_OK

    def _step(self) -> None:
        start = self.clock()
        batch = self.core.begin_step(start)
        sampled = self.engine.executor.execute(batch) if batch else []
        end = self.clock()
        self._send(self.core.finish_step(batch, sampled, end - start if batch else 0.0, end))

    def _send(self, messages) -> None:
        for message in messages:
            if isinstance(message, Handoff):  # a P/D hand-off: its KV as raw frames after it
                self.channel.send(message, self.core.kv_out.pop(message.request_id, ()))
            else:
                self.channel.send(message)

    def _idle_timeout(self) -> float:
        now = self.clock()
        wait = min(self._next_heartbeat - now, LIVENESS_CHECK_INTERVAL)
        if self.config.controller_timeout > 0:
            wait = min(wait, self._last_command + self.config.controller_timeout - now)
        return max(0.0, wait)

    def _housekeeping(self) -> None:
        now = self.clock()
        if now >= self._next_heartbeat:
            self.core.num_bad_frames = self.channel.num_bad_frames
            self.channel.send(self.core.heartbeat(now))
            self._next_heartbeat = now + self.config.heartbeat_interval
        if os.getppid() != self.parent_pid:
            log.warning("instance %d: parent %d is gone; exiting",
                        self.instance_id, self.parent_pid)
            self._exit_code = EXIT_CONTROLLER_LOST
        elif 0 < self.config.controller_timeout <= now - self._last_command:
            log.warning("instance %d: no message from the controller for %.1f s; exiting",
                        self.instance_id, now - self._last_command)
            self._exit_code = EXIT_CONTROLLER_LOST

    # ---- reports -----------------------------------------------------------------------
    def ready(self) -> Ready:
        return self.core.ready(os.getpid(), self.config.executor.kind)
