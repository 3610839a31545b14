"""End to end: the daemon's lifecycle -- drain on SIGTERM, instance supervision, config.

Every test starts its own daemon on the sim executor (no model runs; a constant step
latency makes requests last as long as a test needs) and ends it when done.

Covers: daemon/serve_cmd.py, daemon/supervisor.py.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.daemon_fixture import PROJECT_ROOT, daemon_env, sim_args, wait_for

STEP = 0.02  # seconds per engine step of the sim executor


class _Client:
    """The openai client, bound to the daemon's model name."""

    def __init__(self, daemon) -> None:
        self.openai = openai.OpenAI(base_url=daemon.base_url + "/v1", api_key="unused",
                                    max_retries=0, timeout=30)
        self.model = daemon.get_json("/v1/models")[1]["data"][0]["id"]

    def complete(self, prompt: str = "Hi", max_tokens: int = 3, **kwargs):
        return self.openai.completions.create(model=self.model, prompt=prompt,
                                              max_tokens=max_tokens, **kwargs)

    def stream(self, max_tokens: int):
        return self.complete("Hello", max_tokens, stream=True,
                             stream_options={"include_usage": True})


def _instance(daemon, index: int = 0) -> dict:
    return daemon.health()["instances"][index]


# ---- SIGTERM ----------------------------------------------------------------------------

@pytest.mark.slow
def test_sigterm_lets_the_stream_in_flight_finish_refuses_new_requests_and_exits_0(daemon_factory):
    daemon = daemon_factory(*sim_args(f"constant:{STEP}"), "--drain-timeout", "30")
    client = _Client(daemon)
    max_tokens = 150  # about 3 s at one token per step
    stream = client.stream(max_tokens)
    first = next(iter(stream))
    assert first.choices[0].finish_reason is None
    daemon.signal(signal.SIGTERM)

    def draining():
        status, body = daemon.get_json("/health")
        return status == 503 and body["status"] == "draining"

    wait_for(draining, 30, what="/health to say draining")
    status, body = daemon.post_json("/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert status == 503 and "shutting down" in body["error"]["message"]
    assert daemon.health()["requests_in_flight"] == 1  # still serving the one in flight

    chunks = [first, *stream]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == max_tokens
    assert chunks[-2].choices[0].finish_reason == "length"
    assert daemon.wait_exit(15) == 0  # it did not sit out the 30 s drain timeout
    assert "stopped" in daemon.log()


@pytest.mark.slow
def test_sigterm_with_a_short_drain_timeout_ends_requests_with_an_error_and_exits_0(daemon_factory):
    daemon = daemon_factory(*sim_args(f"constant:{STEP}"), "--drain-timeout", "0.5")
    client = _Client(daemon)
    stream = client.stream(2000)  # about 40 s: far longer than the drain
    next(iter(stream))
    with ThreadPoolExecutor(1) as pool:
        blocking = pool.submit(client.complete, "Hi", 2000)
        wait_for(lambda: daemon.health()["requests_in_flight"] == 2, 10,
                 what="both requests in flight")
        sent = time.monotonic()
        daemon.signal(signal.SIGTERM)
        with pytest.raises(openai.APIError, match="shutting down"):
            for _ in stream:
                pass
        with pytest.raises(openai.InternalServerError, match="shutting down") as info:
            blocking.result(timeout=15)
        assert info.value.status_code == 503
    assert daemon.wait_exit(15) == 0
    # cut at the 0.5 s drain, not served out (about 40 s): a bound a busy machine keeps
    assert time.monotonic() - sent < 30


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_drains_too(daemon_factory):
    """Ctrl-C sends SIGINT to the terminal's whole foreground process group: the instances
    must not die with it while the controller drains."""
    daemon = daemon_factory(*sim_args(f"constant:{STEP}"))
    client = _Client(daemon)
    stream = client.stream(40)
    next(iter(stream))
    os.killpg(daemon.pid, signal.SIGINT)  # the fixture runs the daemon as a group leader
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 40
    assert daemon.wait_exit(15) == 0
    assert "exited with" not in daemon.log()  # no instance died before its Shutdown


# ---- supervision ------------------------------------------------------------------------

@pytest.mark.slow
def test_killed_instance_fails_its_requests_clearly_and_is_restarted(daemon_factory):
    # No other instance, and no wait for the restarted one (tests/test_daemon_faults.py has
    # the takeovers): the requests it held end at once with a clear error.
    daemon = daemon_factory(*sim_args(f"constant:{STEP}"), "--recovery-timeout", "0")
    client = _Client(daemon)
    old = _instance(daemon)
    assert old["state"] == "ready" and old["restarts"] == 0
    stream = client.stream(2000)
    next(iter(stream))
    with ThreadPoolExecutor(1) as pool:
        blocking = pool.submit(client.complete, "Hi", 2000)
        wait_for(lambda: _instance(daemon)["in_flight"] == 2, 10, what="2 requests on instance 0")
        os.kill(old["pid"], signal.SIGKILL)
        # Both requests end at once with an error naming the instance -- no hang.
        with pytest.raises(openai.APIError, match="instance 0 stopped"):
            for _ in stream:
                pass
        with pytest.raises(openai.InternalServerError, match="instance 0 stopped") as info:
            blocking.result(timeout=10)
        assert info.value.status_code == 503

    # Now it restarts (after a backoff): /health says so, and new requests get a clear 503.
    status, health = daemon.get_json("/health")
    assert status == 503 and health["status"] == "degraded"
    instance = health["instances"][0]
    assert instance["state"] in ("restarting", "starting")
    assert health["requests_in_flight"] == 0 and instance["in_flight"] == 0
    # No stale stats of the dead process: it holds no KV blocks and no queue.
    assert (instance["kv_blocks_used"], instance["waiting"], instance["running"]) == (0, 0, 0)
    metrics = daemon.request("GET", "/metrics")[2].decode()
    assert re.search(r'^ascendra_instance_kv_usage\{instance="0"\} 0\.0$', metrics, re.M)
    status, body = daemon.post_json("/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert status == 503 and "no instance is ready" in body["error"]["message"]

    def ready_again():
        status, health = daemon.get_json("/health")
        return status == 200 and health["instances"][0]["state"] == "ready" and health

    health = wait_for(ready_again, 20, what="the instance to be ready again")
    new = health["instances"][0]
    assert new["restarts"] >= 1 and new["pid"] != old["pid"]
    assert client.complete("Hi", 3).usage.completion_tokens == 3
    metrics = daemon.request("GET", "/metrics")[2].decode()
    assert re.search(r'^ascendra_instance_restarts_total\{instance="0"\} 1\.0$', metrics, re.M)
    assert re.search(r'^ascendra_requests_total\{outcome="errored"\} 2\.0$', metrics, re.M)


@pytest.mark.slow
def test_an_instance_that_cannot_start_fails_the_start_with_exit_1(daemon_factory):
    from tests.daemon_fixture import DaemonExited
    # The torch executor on a CUDA device that this machine lacks: the instance exits at once.
    with pytest.raises(DaemonExited, match="exited with code 1") as info:
        daemon_factory("--executor", "torch", "--device", "cuda:7", timeout=60)
    assert "before it was ready" in str(info.value)


# ---- config -----------------------------------------------------------------------------

@pytest.mark.slow
def test_toml_config_and_a_flag_that_overrides_it(daemon_factory, tmp_path):
    config = tmp_path / "ascendra.toml"
    config.write_text('\n'.join([
        '[model]', 'served_model_name = "from-toml"',
        '[instances]', 'executor = "sim"', 'layout = "2xvllm-v1"', 'num_kv_blocks = 300',
        '[process]', 'heartbeat_interval = 0.2', '[http]', 'max_tokens_limit = 50', '']))
    daemon = daemon_factory("--config", str(config), "--served-model-name", "from-flag")
    models = daemon.get_json("/v1/models")[1]["data"]
    assert [m["id"] for m in models] == ["from-flag"]  # the flag wins over the file
    health = daemon.health()
    assert [(i["id"], i["mode"], i["kv_blocks_total"]) for i in health["instances"]] == [
        (0, "vllm-v1", 300), (1, "vllm-v1", 300)]
    status, body = daemon.post_json("/v1/completions", {"prompt": "Hi", "max_tokens": 51})
    assert status == 400 and "50" in body["error"]["message"]


def _serve(*args: str, tmp_path) -> subprocess.CompletedProcess:
    """`ascendra serve ARGS` that is expected to stop at once (bad config)."""
    return subprocess.run(
        [sys.executable, "-m", "daemon.cli", "serve", "--runtime-dir", str(tmp_path / "rt"),
         "--port", "0", *args],
        cwd=PROJECT_ROOT, env=daemon_env(tmp_path / "cache"), capture_output=True, text=True,
        timeout=60)


@pytest.mark.slow
def test_bad_toml_value_exits_2_naming_the_field(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('[instances]\nexecutor = "sim"\n[scheduler]\nchunk_size = "big"\n')
    done = _serve("--config", str(config), tmp_path=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "chunk_size" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("toml,flags,field", [
    ('[http]\ncolour = "red"\n', [], "colour"),                       # unknown field
    ('[scheduler]\nmax_num_seqs = 0\n', [], "max_num_seqs"),           # out of range
    ('[process]\nlog_level = "loud"\n', [], "log_level"),              # not one of the choices
    ('[instances]\ngpus = ["a"]\n', [], "gpus"),                       # wrong item type
    ('[instances]\nexecutor = "sim"\n', ["--sim-latency", "bogus"], "sim_latency"),  # a flag's
    ('[instances]\nexecutor = "sim"\n', ["--drain-timeout", "-1"], "drain_timeout"),
    ('[instances]\nexecutor = "sim"\n', ["--layout", "3xnothing"], "layout"),
    ('executor = "sim"\n', [], "[instances]"),                         # outside its section
    ('[colours]\nred = 1\n', [], "colours"),                          # no such section
    ('port = \n', [], "bad.toml"),                                     # not TOML at all
])
def test_bad_config_is_refused_with_exit_2(tmp_path, capsys, monkeypatch, toml, flags, field):
    from daemon import serve_cmd
    from daemon.cli import main

    def serve(config):
        raise AssertionError(f"the config was accepted: {config}")

    monkeypatch.setattr(serve_cmd, "serve", serve)  # never start a daemon in this process
    config = tmp_path / "bad.toml"
    config.write_text(toml)
    assert main(["serve", "--config", str(config), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ascendra serve: error:") and field in err, err
