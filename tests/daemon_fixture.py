"""Run the real daemon (`python -m daemon.cli serve`) as a subprocess for end-to-end tests.

`start_daemon(...)` starts it with bench/launch/daemon_launcher.py (the benches' launcher too): on
a free 127.0.0.1 port (`--port 0`, learnt from its `--port-file`) with a private runtime
directory, waits (bounded) until /health says ok and returns a `Daemon`. `Daemon.close()`
always ends it and every instance process it started.

Plain helpers (`request`, `get_json`, `post_json`, `wait_for`) talk HTTP to 127.0.0.1 only.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.launch import daemon_launcher
from bench.launch.daemon_launcher import PROJECT_ROOT, START_TIMEOUT, DaemonExited, ServeProcess

__all__ = ["PROJECT_ROOT", "DaemonExited", "Daemon", "start_daemon", "daemon_env", "request",
           "get_json", "post_json", "wait_for", "torch_args", "sim_args"]

#: Seconds one HTTP call may take.
HTTP_TIMEOUT = 30.0


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


class Daemon(ServeProcess):
    """A running `ascendra serve` subprocess (bench.launch.daemon_launcher.ServeProcess), with
    HTTP helpers."""

    def request(self, method: str, path: str, body=None, **kwargs):
        return request(self.base_url, method, path, body, **kwargs)

    def get_json(self, path: str, **kwargs):
        return get_json(self.base_url, path, **kwargs)

    def post_json(self, path: str, body, **kwargs):
        return post_json(self.base_url, path, body, **kwargs)

    def health(self) -> dict:
        """The /health body, whatever its status (503 while degraded or draining)."""
        return self.get_json("/health")[1]


def daemon_env(cache_dir: str | os.PathLike, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The launcher's scrubbed environment, with ASCENDRA_CACHE = `cache_dir` (never
    ~/.cache), then `extra`."""
    return daemon_launcher.daemon_env({"ASCENDRA_CACHE": os.fspath(cache_dir), **(extra or {})})


def start_daemon(log_dir: str | os.PathLike, *args: str, cache_dir: str | os.PathLike,
                 env: dict[str, str] | None = None, wait: bool = True,
                 timeout: float = START_TIMEOUT) -> Daemon:
    """Start `python -m daemon.cli serve --port 0 --port-file F --runtime-dir DIR ARGS...`.

    `args` come last, so a test may override the port or add `--config`. With `wait`
    (default) this returns once /health is ok; on any failure the daemon is ended.
    """
    log_path = Path(log_dir) / f"daemon-{time.monotonic_ns()}.log"
    daemon = Daemon(args, log_path=log_path, start_timeout=timeout,
                    env={"ASCENDRA_CACHE": os.fspath(cache_dir), **(env or {})})
    return daemon_launcher.launch_started(daemon) if wait else daemon.start()


def torch_args() -> list[str]:
    """Flags for a small torch-executor daemon on the CPU."""
    return ["--executor", "torch", "--device", "cpu", "--num-kv-blocks", "512",
            "--heartbeat-interval", "0.2"]


def sim_args(latency: str = "zero", layout: str = "1xsarathi") -> list[str]:
    """Flags for a sim-executor daemon (no model runs; the tokenizer is the tiny model's)."""
    return ["--executor", "sim", "--sim-latency", latency, "--layout", layout,
            "--heartbeat-interval", "0.2", "--restart-backoff-max", "1"]
