"""Run the real daemon (`python -m bench.cli serve`) as a subprocess for end-to-end tests.

`start_daemon(...)` starts it on a free 127.0.0.1 port (`--port 0`; the port is read from
its log) with a private runtime directory, waits (bounded) until /health says ok and
returns a `Daemon`. `Daemon.close()` always ends it and every instance process it started
(found by pid: the daemon's children running `engines.instance_main`).

Plain helpers (`request`, `get_json`, `post_json`, `wait_for`) talk HTTP to 127.0.0.1 only.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.processes import instance_pids, is_instance

PROJECT_ROOT = Path(__file__).resolve().parent.parent
#: Seconds a daemon may take from exec to /health ok (a cold torch import on 2 busy cores).
START_TIMEOUT = 60.0
#: Seconds one HTTP call may take.
HTTP_TIMEOUT = 30.0
_SERVING = re.compile(r"serving .* on http://([0-9.]+):(\d+) ")
#: Environment the tests must not inherit from a shell that runs under systemd or has a key.
_SCRUBBED_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "RUNTIME_DIRECTORY",
                 "ASCENDRA_API_KEY", "LISTEN_FDS", "LISTEN_PID")


class DaemonExited(RuntimeError):
    """The daemon ended before it was serving."""


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.05,
             what: str = "condition") -> Any:
    """Poll `predicate` until it returns something truthy (returned), or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f} s waiting for {what}")
        time.sleep(interval)


def request(base_url: str, method: str, path: str, body: bytes | str | dict | None = None,
            headers: dict[str, str] | None = None, timeout: float = HTTP_TIMEOUT,
            ) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request; returns (status, headers, body). `body` dict is sent as JSON."""
    match = re.match(r"http://([0-9.]+):(\d+)$", base_url)
    assert match and match.group(1) == "127.0.0.1", base_url  # loopback only
    conn = http.client.HTTPConnection(match.group(1), int(match.group(2)), timeout=timeout)
    try:
        if isinstance(body, dict):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        hdrs = {"Content-Type": "application/json"} if body is not None else {}
        hdrs.update(headers or {})
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def get_json(base_url: str, path: str, **kwargs) -> tuple[int, Any]:
    status, _, body = request(base_url, "GET", path, **kwargs)
    return status, json.loads(body)


def post_json(base_url: str, path: str, body, **kwargs) -> tuple[int, Any]:
    status, _, raw = request(base_url, "POST", path, body, **kwargs)
    return status, json.loads(raw)


class Daemon:
    """A running `ascendra serve` subprocess."""

    def __init__(self, proc: subprocess.Popen, log_path: Path, runtime_dir: Path,
                 own_runtime_dir: bool) -> None:
        self.proc = proc
        self.log_path = log_path
        self.runtime_dir = runtime_dir
        self._own_runtime_dir = own_runtime_dir
        self.host = "127.0.0.1"
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # ---- HTTP ------------------------------------------------------------------------
    def request(self, method: str, path: str, body=None, **kwargs):
        return request(self.base_url, method, path, body, **kwargs)

    def get_json(self, path: str, **kwargs):
        return get_json(self.base_url, path, **kwargs)

    def post_json(self, path: str, body, **kwargs):
        return post_json(self.base_url, path, body, **kwargs)

    def health(self) -> dict:
        """The /health body, whatever its status (503 while degraded or draining)."""
        return self.get_json("/health")[1]

    # ---- lifecycle -------------------------------------------------------------------
    def wait_serving(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until the log names the port and /health says ok."""
        deadline = time.monotonic() + timeout

        def port_known():
            self._check_alive()
            match = _SERVING.search(self.log())
            return match and (match.group(1), int(match.group(2)))

        self.host, self.port = wait_for(port_known, timeout, what="the daemon's port in its log")

        def healthy():
            self._check_alive()
            try:
                status, body = self.get_json("/health", timeout=5)
            except OSError:
                return False
            return status == 200 and body["status"] == "ok"

        wait_for(healthy, max(0.1, deadline - time.monotonic()), what="/health ok")

    def _check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise DaemonExited(f"the daemon exited with code {code} before serving; log:\n"
                               + self.log()[-4000:])

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float = 30.0) -> int:
        """The daemon's exit code; fails (after killing it) when it outlives `timeout`."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise AssertionError(f"the daemon did not exit within {timeout} s; log:\n"
                                 + self.log()[-4000:]) from None

    def close(self, grace: float = 10.0) -> None:
        """End the daemon (SIGTERM, then SIGKILL after `grace`) and every process it started."""
        instances = instance_pids(self.proc.pid) if self.proc.poll() is None else []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        _kill_group(self.proc.pid)  # the daemon, if still alive, and anything in its group
        if self.proc.poll() is None:
            self.proc.wait(10)
        for pid in instances:  # instances run in sessions of their own
            if is_instance(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self._own_runtime_dir:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def daemon_env(cache_dir: str | os.PathLike, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    env["ASCENDRA_CACHE"] = os.fspath(cache_dir)  # never write to ~/.cache
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def start_daemon(log_dir: str | os.PathLike, *args: str, cache_dir: str | os.PathLike,
                 env: dict[str, str] | None = None, runtime_dir: str | os.PathLike | None = None,
                 wait: bool = True, timeout: float = START_TIMEOUT) -> Daemon:
    """Start `python -m bench.cli serve --port 0 --runtime-dir DIR ARGS...`.

    `args` come last, so a test may override the port or add `--config`. With `wait`
    (default) this returns once /health is ok; on any failure the daemon is ended.
    """
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    own = runtime_dir is None
    # A short path of its own: the socket path must stay under 108 bytes.
    rt = Path(tempfile.mkdtemp(prefix="ascrt-")) if own else Path(runtime_dir)
    log_path = log_dir / f"daemon-{time.monotonic_ns()}.log"
    cmd = [sys.executable, "-m", "bench.cli", "serve", "--host", "127.0.0.1", "--port", "0",
           "--runtime-dir", str(rt / "rt"), *args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=daemon_env(cache_dir, env),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    daemon = Daemon(proc, log_path, rt, own)
    if wait:
        try:
            daemon.wait_serving(timeout)
        except BaseException:
            daemon.close(grace=2.0)
            raise
    return daemon


def torch_args() -> list[str]:
    """Flags for a small torch-executor daemon on the CPU."""
    return ["--executor", "torch", "--device", "cpu", "--num-kv-blocks", "512",
            "--heartbeat-interval", "0.2"]


def sim_args(latency: str = "zero", layout: str = "1xsarathi") -> list[str]:
    """Flags for a sim-executor daemon (no model runs; the tokenizer is the tiny model's)."""
    return ["--executor", "sim", "--sim-latency", latency, "--layout", layout,
            "--heartbeat-interval", "0.2", "--restart-backoff-max", "1"]
