"""Start `ascendra serve` as a subprocess, learn its port, end it: the one launcher of the
benches (chaos, stream_throughput, live_check) and the tests (tests/daemon_fixture.py).

    with ServeProcess(["--executor", "sim"]) as daemon:   # started and serving
        ... daemon.url ...
    # ended here, its instance processes too

It runs `python -m daemon.cli serve --host 127.0.0.1 --port 0 --port-file F --runtime-dir D
ARGS...` (ARGS last, so they may override any of these) in a session of its own, with a
short private temporary folder for F, D (the socket path must stay under 108 bytes) and,
unless given one, the log. The daemon writes its port to F once it listens
(daemon/config.py `HttpConfig.port_file`); then /health must say ok. A daemon that exits
first, or is not serving in time, raises `DaemonExited` / `DaemonStartError` with its exit
code and the end of its log. `stop()` sends SIGTERM, then SIGKILL to the daemon's process
group after a grace period, and SIGKILL to every instance process it had started (they run
in sessions of their own: found by pid, bench/launch/processes.py).
"""
from __future__ import annotations

import asyncio
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.launch.processes import instance_pids, is_instance, kill_quietly

PROJECT_ROOT = Path(__file__).resolve().parents[2]
#: Seconds a daemon may take from exec to /health ok (a cold torch import on 2 busy cores).
START_TIMEOUT = 60.0
#: Environment a launched daemon must not inherit from a shell that runs under systemd or
#: has a key (its /v1 routes would want one).
SCRUBBED_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "RUNTIME_DIRECTORY",
                "ASCENDRA_API_KEY", "LISTEN_FDS", "LISTEN_PID")
LOG_TAIL_CHARS = 4000
_POLL_S = 0.05


class DaemonStartError(RuntimeError):
    """The daemon was not serving in time (the message has the end of its log)."""


class DaemonExited(DaemonStartError):
    """The daemon ended before it was serving (the message has its exit code and log's end)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now (for a daemon without --port-file; another process may take it
    before the daemon does, which then fails to start saying so)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def daemon_env(extra: dict[str, str] | None = None, root: Path = PROJECT_ROOT) -> dict[str, str]:
    """This process's environment without `SCRUBBED_ENV`, with `root` first on PYTHONPATH,
    unbuffered output, then `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(root)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class ServeProcess:
    """One `ascendra serve` subprocess.

    `root` is the checkout whose code runs (default this one). `port=0` (default) learns
    the port from the port file; a fixed `port` with `port_file=False` only polls /health
    there (for a checkout older than --port-file).
    """

    def __init__(self, args: Sequence[str] = (), *, log_path: str | os.PathLike | None = None,
                 env: dict[str, str] | None = None, root: str | os.PathLike = PROJECT_ROOT,
                 host: str = "127.0.0.1", port: int = 0, port_file: bool = True,
                 start_timeout: float = START_TIMEOUT) -> None:
        if not port_file and not port:
            raise ValueError("a daemon without a port file needs a fixed port")
        self.args = list(args)
        self.root = Path(root)
        self.host = host
        self.port = 0 if port_file else port
        self._fixed_port = port
        self.tmp = Path(tempfile.mkdtemp(prefix="ascd-"))  # short: socket path limit
        self.runtime_dir = self.tmp / "rt"
        self.port_file = self.tmp / "port" if port_file else None
        self.log_path = Path(log_path) if log_path else self.tmp / "daemon.log"
        self.env = daemon_env(env, self.root)
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None

    # ---- what it is -----------------------------------------------------------------------
    def command(self) -> list[str]:
        port_file = ["--port-file", str(self.port_file)] if self.port_file else []
        return [sys.executable, "-m", "daemon.cli", "serve", "--host", self.host,
                "--port", str(self._fixed_port), *port_file,
                "--runtime-dir", str(self.runtime_dir), *self.args]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    base_url = url

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        """The end of the log, for an error message (a log of its own is named: it stays)."""
        kept = "" if self.log_path.parent == self.tmp else f" ({self.log_path})"
        return f"the end of its log{kept}:\n{self.log()[-chars:]}"

    def instance_pids(self) -> list[int]:
        return instance_pids(self.proc.pid) if self.proc and self.proc.poll() is None else []

    # ---- start ----------------------------------------------------------------------------
    def start(self) -> ServeProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(), cwd=self.root, env=self.env,
                                         stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def wait_serving(self, timeout: float | None = None) -> ServeProcess:
        """Wait until the port is known and /health says ok; raises `DaemonExited` if the
        daemon ends first, `DaemonStartError` after `timeout` seconds (default
        `start_timeout`)."""
        timeout = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while not self._serving():
            if time.monotonic() >= deadline:
                raise self._not_serving(timeout)
            time.sleep(_POLL_S)
        return self

    async def wait_serving_async(self, timeout: float | None = None) -> ServeProcess:
        """`wait_serving` for a caller on an event loop (each look runs in a thread)."""
        timeout = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while not await asyncio.to_thread(self._serving):
            if time.monotonic() >= deadline:
                raise self._not_serving(timeout)
            await asyncio.sleep(_POLL_S)
        return self

    def _serving(self) -> bool:
        code = self.proc.poll()
        if code is not None:
            raise DaemonExited(f"`ascendra serve` exited with code {code} before serving; "
                               + self.log_tail())
        if not self.port:
            self.port = self._read_port_file()
        return bool(self.port) and self._healthy()

    def _read_port_file(self) -> int:
        try:
            text = self.port_file.read_text()
        except FileNotFoundError:
            return 0
        return int(text) if text.endswith("\n") else 0  # written whole, but be sure

    def _healthy(self) -> bool:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=5)
        try:
            conn.request("GET", "/health")
            resp = conn.getresponse()
            return resp.status == 200 and json.loads(resp.read()).get("status") == "ok"
        except (OSError, ValueError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def _not_serving(self, timeout: float) -> DaemonStartError:
        where = (f"/health on port {self.port} not ok" if self.port
                 else "no port in its port file yet")
        return DaemonStartError(f"`ascendra serve` was not serving within {timeout:.0f} s "
                                f"({where}); " + self.log_tail())

    # ---- stop -----------------------------------------------------------------------------
    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float = 30.0) -> int:
        """The daemon's exit code; fails (after killing it) when it outlives `timeout`."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop(grace=0)
            raise AssertionError(f"the daemon did not exit within {timeout} s; "
                                 + self.log_tail()) from None

    def stop(self, grace: float = 10.0) -> int | None:
        """End the daemon (SIGTERM, then SIGKILL to its process group after `grace` s) and
        every instance process it had started; remove the temporary folder. Returns its
        exit code (None if it was never started)."""
        if self.proc is None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return None
        instances = self.instance_pids()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        try:  # the daemon, if still alive, and anything else in its group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        code = self.proc.wait(10)
        for pid in instances:  # in sessions of their own
            if is_instance(pid):
                kill_quietly(pid)
        shutil.rmtree(self.tmp, ignore_errors=True)
        return code

    close = stop

    def __enter__(self) -> ServeProcess:
        return launch_started(self)

    def __exit__(self, *exc) -> None:
        self.stop()


def launch_started(daemon: ServeProcess, timeout: float | None = None) -> ServeProcess:
    """Start `daemon` and wait until it serves; on any failure it is ended first."""
    daemon.start()
    try:
        return daemon.wait_serving(timeout)
    except BaseException:
        daemon.stop(grace=2.0)
        raise


def launch(args: Sequence[str] = (), **kwargs) -> ServeProcess:
    """A serving `ServeProcess(args, **kwargs)`; on any failure it is ended first."""
    return launch_started(ServeProcess(args, **kwargs))
