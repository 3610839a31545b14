"""bench/launch/daemon_launcher.py, the one way benches and tests start `ascendra serve`: the port
comes from the daemon's --port-file, a daemon that cannot start says why (its log's end),
and stopping it ends its instance processes too.

Covers: bench/launch/daemon_launcher.py.
"""
from __future__ import annotations

import signal

import pytest

from bench.launch.daemon_launcher import DaemonExited, ServeProcess
from bench.launch.processes import alive
from tests.daemon_fixture import sim_args, start_daemon, wait_for


@pytest.mark.slow
def test_a_daemon_that_cannot_start_says_why(tmp_path):
    daemon = ServeProcess(["--executor", "sim", "--layout", "3xnothing"],
                          env={"ASCENDRA_CACHE": str(tmp_path / "cache")})
    with pytest.raises(DaemonExited, match="exited with code 2") as info:
        daemon.__enter__()
    assert "layout" in str(info.value) and "the end of its log" in str(info.value)
    assert not daemon.tmp.exists()  # ended and cleaned up


@pytest.mark.slow
def test_the_port_comes_from_the_port_file_which_the_daemon_removes_at_exit(
        tmp_path, daemon_cache, tiny_models):
    daemon = start_daemon(tmp_path, "--model", str(tiny_models["llama"]), *sim_args(),
                          cache_dir=daemon_cache)
    try:
        assert daemon.port_file.read_text() == f"{daemon.port}\n"
        assert f"on http://127.0.0.1:{daemon.port} " in daemon.log()
        assert daemon.health()["status"] == "ok"
        daemon.signal(signal.SIGTERM)
        assert daemon.wait_exit(15) == 0
        assert not daemon.port_file.exists()
    finally:
        daemon.close()


@pytest.mark.slow
def test_stop_ends_the_daemon_and_its_instances(tmp_path, daemon_cache, tiny_models):
    daemon = ServeProcess(["--model", str(tiny_models["llama"]),
                           *sim_args(layout="2xsarathi")],
                          env={"ASCENDRA_CACHE": str(daemon_cache)}).__enter__()
    instances = daemon.instance_pids()
    assert len(instances) == 2
    daemon.signal(signal.SIGSTOP)  # deaf to SIGTERM: the grace runs out, SIGKILL follows
    assert daemon.stop(grace=0.5) == -signal.SIGKILL
    wait_for(lambda: not any(alive(pid) for pid in [daemon.pid, *instances]), 30,
             what="the daemon and its instances to be gone")
    assert not daemon.tmp.exists()


@pytest.mark.slow
def test_a_port_file_that_cannot_be_written_fails_the_start(tmp_path, daemon_cache,
                                                             tiny_models):
    with pytest.raises(DaemonExited, match="exited with code 1") as info:
        start_daemon(tmp_path, "--model", str(tiny_models["llama"]), *sim_args(),
                     "--port-file", str(tmp_path / "absent" / "port"), cache_dir=daemon_cache)
    assert "cannot write the port file" in str(info.value)
