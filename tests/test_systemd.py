"""systemd integration: sd_notify messages of the real daemon, the Notifier, the unit file
(`systemd-analyze verify`) and the example config.

Covers: daemon/systemd.py, systemd/.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import pytest

from daemon.config import SECTIONS, ServeConfig, field_docs, load_config
from daemon.systemd import Notifier
from tests.daemon_fixture import PROJECT_ROOT, sim_args

UNIT = PROJECT_ROOT / "systemd" / "ascendra.service"
EXAMPLE_CONFIG = PROJECT_ROOT / "systemd" / "ascendra.toml"
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class NotifySocket:
    """A stand-in for systemd's notification socket: AF_UNIX datagrams, with the sender's
    credentials (SO_PASSCRED) so a test can see which process sent each message."""

    def __init__(self, address: str | None = None) -> None:
        self._dir = None
        if address is None:  # a short path: sun_path is 108 bytes
            self._dir = tempfile.mkdtemp(prefix="ascnotify-")
            address = os.path.join(self._dir, "notify")
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)

    def recv(self, timeout: float) -> tuple[str, int | None] | None:
        """(message, sender pid) of the next datagram, or None after `timeout` seconds."""
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data, ancdata, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(_UCRED.size))
        except TimeoutError:
            return None
        pid = None
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid = _UCRED.unpack(payload[:_UCRED.size])[0]
        return data.decode(), pid

    def until(self, predicate, timeout: float) -> list[tuple[str, int | None]]:
        """Every message up to and including the first that satisfies `predicate`."""
        deadline = time.monotonic() + timeout
        got = []
        while True:
            item = self.recv(deadline - time.monotonic())
            if item is None:
                raise TimeoutError(f"no matching sd_notify message within {timeout} s; got {got}")
            got.append(item)
            if predicate(item[0]):
                return got

    def close(self) -> None:
        self.sock.close()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)


@pytest.fixture
def notify_socket():
    sock = NotifySocket()
    yield sock
    sock.close()


# ---- the daemon's messages --------------------------------------------------------------

@pytest.mark.slow
def test_daemon_sends_ready_watchdog_and_stopping(daemon_factory, notify_socket):
    daemon = daemon_factory(*sim_args(), wait=False,
                            env={"NOTIFY_SOCKET": notify_socket.address, "WATCHDOG_USEC": "200000"})
    # READY=1 is the first message, sent once every instance is ready and the port is open.
    [(ready, sender)] = notify_socket.until(lambda m: True, timeout=60)
    assert ready.splitlines()[0] == "READY=1", ready
    assert sender == daemon.pid  # from the main process (the unit has NotifyAccess=main)
    daemon.wait_serving(timeout=30)
    status, health = daemon.get_json("/health")
    assert status == 200 and health["status"] == "ok"
    assert f"STATUS=serving on port {daemon.port}" in ready.splitlines()

    # WATCHDOG=1 about every WATCHDOG_USEC / 2 = 0.1 s.
    started = time.monotonic()
    beats = [notify_socket.until(lambda m: True, timeout=10)[0] for _ in range(4)]
    assert all(m == "WATCHDOG=1" and pid == daemon.pid for m, pid in beats), beats
    assert time.monotonic() - started < 10  # generous: the box may be busy

    daemon.signal(signal.SIGTERM)
    got = notify_socket.until(lambda m: m == "STOPPING=1", timeout=10)
    assert {m for m, _ in got} <= {"WATCHDOG=1", "STOPPING=1"}
    assert daemon.wait_exit(15) == 0
    assert notify_socket.recv(0.3) is None  # nothing after STOPPING=1


@pytest.mark.slow
def test_daemon_survives_a_notify_socket_that_is_gone(daemon_factory, tmp_path):
    daemon = daemon_factory(*sim_args(), env={"NOTIFY_SOCKET": str(tmp_path / "absent"),
                                              "WATCHDOG_USEC": "200000"})
    time.sleep(0.3)  # a few failed WATCHDOG=1 sends
    assert daemon.get_json("/health")[0] == 200
    daemon.signal(signal.SIGTERM)
    assert daemon.wait_exit(15) == 0
    assert "sd_notify READY=1" in daemon.log() and "Traceback" not in daemon.log()


# ---- Notifier ---------------------------------------------------------------------------

def test_notifier_without_notify_socket_is_a_no_op():
    notifier = Notifier({})
    assert not notifier.enabled and notifier.watchdog_interval is None
    assert notifier.ready("x") is False
    assert notifier.watchdog() is False and notifier.stopping() is False


def test_notifier_sends_to_a_path_socket(notify_socket):
    notifier = Notifier({"NOTIFY_SOCKET": notify_socket.address, "WATCHDOG_USEC": "3000000"})
    assert notifier.enabled and notifier.watchdog_interval == 1.5
    assert notifier.ready("serving on port 1")
    assert notifier.watchdog() and notifier.stopping()
    messages = [notify_socket.recv(2)[0] for _ in range(3)]
    assert messages == ["READY=1\nSTATUS=serving on port 1", "WATCHDOG=1", "STOPPING=1"]


def test_notifier_sends_to_an_abstract_socket():
    name = f"@ascendra-test-{os.getpid()}-{time.monotonic_ns()}"
    sock = NotifySocket(name)
    try:
        notifier = Notifier({"NOTIFY_SOCKET": name})
        assert notifier.address == "\0" + name[1:]
        assert notifier.ready() and notifier.watchdog()
        assert [sock.recv(2)[0] for _ in range(2)] == ["READY=1", "WATCHDOG=1"]
    finally:
        sock.close()


@pytest.mark.parametrize("usec,interval", [("", None), ("0", None), ("abc", None), ("-5", None),
                                           ("200000", 0.1)])
def test_notifier_watchdog_interval_is_half_of_watchdog_usec(usec, interval):
    assert Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": usec}).watchdog_interval == interval


def test_notifier_never_raises_when_the_socket_is_missing(tmp_path):
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "absent")})
    assert notifier.enabled and notifier.ready() is False


# ---- the unit file ----------------------------------------------------------------------

def _unit_settings(text: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_unit_is_a_notify_service_that_restarts_on_failure():
    unit = _unit_settings(UNIT.read_text())
    for key, value in [("Type", "notify"), ("NotifyAccess", "main"), ("Restart", "on-failure"),
                       ("KillMode", "mixed"), ("RuntimeDirectoryMode", "0700"),
                       ("NoNewPrivileges", "yes"), ("ProtectSystem", "strict")]:
        assert unit[key] == [value], key
    assert re.fullmatch(r"\S+/ascendra serve --config /etc/ascendra/ascendra\.toml",
                        unit["ExecStart"][0])
    # The unit's stop timeout leaves room for the example config's drain.
    drain = load_config(str(EXAMPLE_CONFIG)).process.drain_timeout
    assert int(unit["TimeoutStopSec"][0]) >= drain + 30
    assert int(unit["WatchdogSec"][0]) > 0


def test_systemd_analyze_verify_passes(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    ascendra = Path(sys.executable).parent / "ascendra"
    assert os.access(ascendra, os.X_OK), f"no ascendra console script at {ascendra}"
    config = tmp_path / "ascendra.toml"
    shutil.copy(EXAMPLE_CONFIG, config)
    text = UNIT.read_text()
    assert "/opt/ascendra/.venv/bin/ascendra" in text and "/etc/ascendra/ascendra.toml" in text
    text = (text.replace("/opt/ascendra/.venv/bin/ascendra", str(ascendra))
                .replace("/etc/ascendra/ascendra.toml", str(config)))
    unit = tmp_path / "ascendra.service"  # verify names the unit after its file
    unit.write_text(text)
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "SYSTEMD_PAGER": "cat", "LC_ALL": "C"})
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    # Other units of this machine may draw warnings; ours must draw none.
    assert not [line for line in output.splitlines() if "ascendra" in line], output


# ---- the example config -----------------------------------------------------------------

def test_example_config_loads_and_names_every_field():
    config = load_config(str(EXAMPLE_CONFIG))
    assert config == ServeConfig()  # the example shows the defaults
    text = EXAMPLE_CONFIG.read_text()
    set_here = {name for section in tomllib.loads(text).values() for name in section}
    commented = set(re.findall(r"^# (\w+) = ", text, re.M))
    fields = {d.name for d in field_docs()}
    assert fields == set_here | commented, (fields ^ (set_here | commented))
    assert set(tomllib.loads(text)) == set(SECTIONS)
