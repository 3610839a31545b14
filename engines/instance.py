"""The instance process's driver: the instance core over a ZeroMQ socket and a real executor.

    send Ready
    loop:                    # the core's turn (engines/instance_core.py), carried out here
        drain commands       # without blocking while there is work; blocking (with a
                             # timeout, for heartbeats and liveness checks) when idle
        core.take            # each command; exit after Shutdown
        core.begin_step      # the batch: run on the executor and timed (engines/timed_step.py),
        core.finish_step     # then ONE StepOutputs per step, hand-offs, offloads, drops, Ticket
        heartbeat, liveness  # periodic Heartbeat; exit if the controller is gone

Every rule is the core's; this file times the step, moves messages, does the device work
the core asks for (a P/D hand-off's KV: `export_kv` for a Handoff, its frames attached;
`import_kv` of the frames that came with a SubmitPrefilled, kept here till then) and
watches its parent. Exit codes: 0 after Shutdown, 1 after an unexpected error
(InstanceFailed sent first), 3 when the controller is gone (parent changed, or no message
within controller_timeout).
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import msgspec

from engines.executors.base import Executor
from engines.handoff import ExportKv, ImportKv
from engines.instance_config import InstanceConfig
from engines.instance_core import InstanceCore, Output
from engines.esp_parts import EspStep
from engines.step_log import StepLog
from engines.timed_step import run_timed, timed_step
from ipc.channel import InstanceChannel
from ipc.messages import InstanceFailed, Ready
from engines.perf.model import PerfModel

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONTROLLER_LOST = 3
#: Longest an ESP group's member waits for the others inside a step, seconds: for all to
#: arrive, then for the gloo group to form and for each collective (gloo's one timeout for
#: both). Once all arrived they compute in step, layer by layer, so a collective waits only
#: for the slowest member's layer; a member that died between its arrival and forming the
#: group fails the others' step this long after (one that died later closes its
#: connections: their collectives fail at once).
ESP_TIMEOUT_S = 20.0
#: How often a member waiting for its group's others looks again, seconds.
ESP_POLL_S = 0.01
#: Longest idle wait between liveness checks, seconds.
LIVENESS_CHECK_INTERVAL = 0.25


def esp_store_path(endpoint: str, request_id: str) -> str:
    """Where the members of a request's ESP group meet: a file beside the controller's
    socket (the daemon's runtime folder), named by the request id."""
    folder = os.path.dirname(endpoint.removeprefix("ipc://"))
    return os.path.join(folder, "esp-" + "".join(c if c.isalnum() or c in "-_." else "_"
                                                 for c in request_id))


class Instance:
    def __init__(self, config: InstanceConfig, executor: Executor, channel: InstanceChannel,
                 perf_model: PerfModel | None = None,
                 clock: Callable[[], float] = time.monotonic, core=None) -> None:
        """`core`: built elsewhere (a multiplexed instance's MuxCore, engines/mux_core.py,
        over `executor`, its MuxExecutor); None: an InstanceCore of `config`."""
        self.config = config
        self.core = core if core is not None else InstanceCore(
            config.instance_id, config.resolved_role, executor, config.scheduler, perf_model)
        self.executor = executor
        self.channel = channel
        self.clock = clock
        self.instance_id = config.instance_id
        self.parent_pid = config.parent_pid if config.parent_pid is not None else os.getppid()
        self._exit_code: int | None = None
        #: P/D decode instance: the KV frames of prefilled requests waiting for a seat, by
        #: request id, till the core asks for them (ImportKv).
        self._kv_frames: dict[str, list] = {}
        #: every step recorded (instances.step_log); None: steps run untimed beyond the core's
        self._step_log = StepLog(config.step_log) if config.step_log else None
        #: ESP groups whose prefill is under way here, by request id: the group and this
        #: rank's sequence (None before its first chunk), from the first chunk to the last.
        self._esp_runs: dict[str, tuple] = {}
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
        finally:
            if self._step_log is not None:
                self._step_log.close()
        return self._exit_code

    def _serve_once(self) -> None:
        """One turn of the core's loop."""
        core = self.core
        self._take(0.0 if core.has_work else self._idle_timeout())
        if core.stopped:
            log.info("instance %d: shutting down", self.instance_id)
            self._exit_code = EXIT_OK
            return
        if core.esp_step_due:
            self._carry_out(self._esp_step())
        else:
            step = self._step_log.timed_step if self._step_log else timed_step
            self._carry_out(step(core, self.executor, self.clock))
        if self._kv_frames:  # frames of requests no longer waiting (aborted, recomputed)
            self._kv_frames = {request_id: frames for request_id, frames
                               in self._kv_frames.items() if request_id in core.prefilled}
        self._housekeeping()

    def _take(self, timeout: float) -> None:
        """Drain the commands that came (waiting up to `timeout`) into the core."""
        received = self.channel.drain(timeout)
        if received:
            self._last_command = self.clock()
        commands = []
        for command, frames in received:
            if frames:  # a SubmitPrefilled's KV (a duplicate id's never replaces the first's)
                self._kv_frames.setdefault(command.request_id, frames)
            commands.append(command)
        self._carry_out(self.core.take(commands, self.clock(), self.channel.num_bad_frames))

    def _carry_out(self, outputs: list[Output]) -> None:
        """Send the core's messages, in order; do the KV moves it asks for."""
        for output in outputs:
            kind = type(output)
            if kind is ExportKv:  # a P/D hand-off: its KV as raw frames after the message
                layout, frames = self.executor.export_kv(output.block_ids, output.num_tokens)
                self.channel.send(msgspec.structs.replace(output.handoff, kv=layout), frames)
            elif kind is ImportKv:
                frames = self._kv_frames.pop(output.request_id, [])
                try:
                    self.executor.import_kv(output.block_ids, output.layout, frames)
                except ValueError as exc:  # frames that do not fit this cache
                    self._carry_out(self.core.refuse_kv(output.request_id, str(exc)))
            else:
                self.channel.send(output)

    def _esp_step(self) -> list[Output]:
        """The next chunk of an ESP group's prefill (engines/esp_parts.py) -- or the core's
        step of its own decodes between two chunks. The members meet before the first
        chunk (the group and this rank's sequence are kept until the last), then each
        chunk's stripe and, after the last, the KV gathered to the master run on the
        executor, each timed in the log. A member that dies before it is there ends the
        wait on the controller's word (an EspLeave saying so), one that dies or stalls
        later fails the chunk in gloo (after `ESP_TIMEOUT_S` at most): the master then
        recomputes the prompt alone, a holder frees its part. An executor without real
        KV (the sim's) has nothing to compute."""
        start = self.clock()
        step, outputs = self.core.begin_step(start)
        if not isinstance(step, EspStep):   # its own decodes first
            return run_timed(self.core, self.executor, self.clock, step, start) if step \
                else outputs
        failed = False
        if self.executor.carries_kv:
            # torch only here: a sim-executor instance never imports it
            from engines.models.sequence_parallel import EspGroup, meeting_store
            try:
                if step.begin == 0:
                    store = meeting_store(esp_store_path(self.config.endpoint,
                                                         step.request_id), step.degree)
                    self._esp_runs[step.request_id] = (store, None, None)
                store, group, sequence = self._esp_runs[step.request_id]
                if not self._esp_meet(step, store):
                    raise RuntimeError("a member stopped before the group met")
                met = self.clock()
                if group is None:
                    group = EspGroup.over(store, step.rank, step.degree, ESP_TIMEOUT_S)
                sequence = self.executor.esp_prefill(step, group, sequence)
                self._esp_runs[step.request_id] = (store, group, sequence)
                prefilled = self.clock()
                if step.last:
                    del self._esp_runs[step.request_id]
                    self.executor.esp_gather(step, sequence)
                log.info("instance %d: ESP step of request %s, rank %d of %d, prompt tokens "
                         "%d-%d of %d: met %.3f s, prefill %.3f s, KV gather %.3f s",
                         self.instance_id, step.request_id, step.rank, step.degree,
                         step.begin, step.stop, step.num_tokens, met - start,
                         prefilled - met, self.clock() - prefilled)
            except RuntimeError as exc:  # gloo: a member gone or silent
                log.warning("instance %d: ESP step of request %s failed (%s); %s",
                            self.instance_id, step.request_id, exc,
                            "recomputing it alone" if step.master else "part freed")
                self._esp_runs.pop(step.request_id, None)
                failed = True
        return self.core.finish_esp(step, self.clock(), failed)

    def _esp_meet(self, step, store) -> bool:
        """Wait for the group's members at the step's chunk, taking commands and running
        the core's steps of its own decodes meanwhile (`waiting_step`); False when a
        member stopped (or this instance is told to stop) first."""
        from engines.models.sequence_parallel import all_arrived, arrive
        arrive(store, step.begin)
        deadline = self.clock() + ESP_TIMEOUT_S
        while not all_arrived(store, step.degree, step.begin):
            if self.core.esp.lost(step.request_id) or self.core.stopped:
                return False
            if self.clock() > deadline:
                raise RuntimeError(f"the group's members not all there in {ESP_TIMEOUT_S} s")
            start = self.clock()
            batch = self.core.waiting_step(start)
            if batch:
                self._carry_out(run_timed(self.core, self.executor, self.clock, batch, start))
            self._take(0.0 if batch else ESP_POLL_S)
        return True

    def _idle_timeout(self) -> float:
        now = self.clock()
        wait = min(self._next_heartbeat - now, LIVENESS_CHECK_INTERVAL)
        if self.config.controller_timeout > 0:
            wait = min(wait, self._last_command + self.config.controller_timeout - now)
        return max(0.0, wait)

    def _housekeeping(self) -> None:
        now = self.clock()
        if now >= self._next_heartbeat:
            self.channel.send(self.core.heartbeat(now, self.channel.num_bad_frames))
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
        ready = self.core.ready(os.getpid(), self.config.executor.kind)
        ranks = getattr(self.executor, "ranks", None)  # tensor parallel: engines/tp_ranks.py
        return msgspec.structs.replace(
            ready, tp=self.config.executor.tp, devices=list(self.config.gpus or []),
            rank_pids=ranks.pids if ranks is not None else [])
