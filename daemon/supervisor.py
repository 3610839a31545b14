"""Instance processes: start them, notice when one dies, restart it with backoff.

The supervisor knows processes, not requests: it tells the controller (via
`on_exit`) that an instance died, and the controller settles the requests it held.
"""
from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engines.instance_config import InstanceConfig
from engines.instance_launch import instance_command, instance_env, with_parent
from ipc.messages import Ready

log = logging.getLogger(__name__)

#: An instance that stayed up this long starts its next restart backoff from scratch.
STABLE_AFTER_S = 60.0


class InstanceState(str, enum.Enum):
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    STOPPED = "stopped"


@dataclass
class InstanceSlot:
    """One instance of the layout, across its restarts."""

    config: InstanceConfig
    state: InstanceState = InstanceState.STARTING
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    started_at: float = 0.0
    backoff: float = 1.0
    became_ready: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def instance_id(self) -> int:
        return self.config.instance_id

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None


class Supervisor:
    def __init__(self, configs: list[InstanceConfig], on_exit: Callable[[InstanceSlot, int], None],
                 backoff_max: float = 30.0) -> None:
        self.slots = {c.instance_id: InstanceSlot(c) for c in configs}
        self.on_exit = on_exit
        self.backoff_max = backoff_max
        self.stopping = False
        self.started = False  # every instance was ready once; from then on, exits restart
        self._start_failed: asyncio.Future[str] | None = None
        self._watchers: list[asyncio.Task] = []

    async def start(self, timeout: float) -> None:
        """Start every instance and wait until all have sent Ready.

        An instance that exits before its first Ready (a bad model, device or setting)
        fails the start at once: restarting it would only fail again."""
        self._start_failed = asyncio.get_running_loop().create_future()
        for slot in self.slots.values():
            await self._spawn(slot)
            self._watchers.append(asyncio.create_task(self._watch(slot)))
        all_ready = asyncio.ensure_future(
            asyncio.gather(*(s.became_ready.wait() for s in self.slots.values())))
        await asyncio.wait({all_ready, self._start_failed}, timeout=timeout,
                           return_when=asyncio.FIRST_COMPLETED)
        if not all_ready.done():
            all_ready.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await all_ready
            if self._start_failed.done():
                raise RuntimeError(self._start_failed.result())
            late = [s.instance_id for s in self.slots.values() if s.state is not InstanceState.READY]
            raise RuntimeError(f"instances {late} were not ready within {timeout:.0f} s")
        self.started = True

    def mark_ready(self, ready: Ready) -> None:
        slot = self.slots.get(ready.instance_id)
        if slot is None or slot.state is InstanceState.STOPPED:
            return
        slot.state = InstanceState.READY  # its Ready itself lives in the core's InstanceView
        slot.became_ready.set()
        log.info("instance %d (%s) ready: pid %d, %d KV blocks", ready.instance_id, ready.role,
                 ready.pid, ready.num_kv_blocks)

    async def _spawn(self, slot: InstanceSlot) -> None:
        config = with_parent(slot.config)
        slot.state = InstanceState.STARTING
        slot.became_ready.clear()
        # A session of its own: a terminal's Ctrl-C (SIGINT to the foreground process group)
        # reaches only the controller, which drains and then stops the instances itself.
        # An instance still exits when the controller dies (it watches its parent pid).
        slot.process = await asyncio.create_subprocess_exec(
            *instance_command(config), env=instance_env(config), stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True)
        slot.started_at = time.monotonic()

    async def _watch(self, slot: InstanceSlot) -> None:
        """Wait for the process to exit; unless we are stopping, report it and restart it."""
        while True:
            code = await slot.process.wait()
            if self.stopping:
                slot.state = InstanceState.STOPPED
                return
            if not self.started:
                slot.state = InstanceState.STOPPED
                if self._start_failed is not None and not self._start_failed.done():
                    self._start_failed.set_result(
                        f"instance {slot.instance_id} (pid {slot.pid}) exited with code {code} "
                        "before it was ready")
                return
            log.error("instance %d (pid %s) exited with %s; restarting in %.0f s",
                      slot.instance_id, slot.pid, code, slot.backoff)
            slot.state = InstanceState.RESTARTING
            self.on_exit(slot, code)
            if time.monotonic() - slot.started_at > STABLE_AFTER_S:
                slot.backoff = 1.0
            await asyncio.sleep(slot.backoff)
            slot.backoff = min(slot.backoff * 2, self.backoff_max)
            if self.stopping:
                slot.state = InstanceState.STOPPED
                return
            slot.restarts += 1
            await self._spawn(slot)

    async def stop(self, timeout: float = 10.0) -> None:
        """Wait for instances to exit (after the controller sent Shutdown to the ready ones;
        the others, still starting, get SIGTERM); kill stragglers."""
        self.stopping = True
        procs = [s.process for s in self.slots.values() if s.process]
        for slot in self.slots.values():
            alive = slot.process is not None and slot.process.returncode is None
            if alive and slot.state is not InstanceState.READY:
                slot.process.terminate()
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), timeout)
        except TimeoutError:
            for p in procs:
                if p.returncode is None:
                    p.kill()
            await asyncio.gather(*(p.wait() for p in procs))
        for task in self._watchers:
            task.cancel()
        for slot in self.slots.values():
            slot.state = InstanceState.STOPPED
