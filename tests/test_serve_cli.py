"""`ascendra` on the command line: --version, `serve --help` documenting every config field
with its default, boolean switches, --print-config (= systemd/ascendra.toml), a taken port
(one line, exit code 1), and the real daemon cutting off slow and surplus clients.

Covers: daemon/cli.py, daemon/serve_cmd.py, daemon/config.py.
"""
from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from daemon.cli import build_parser, main, verb_parser
from daemon.config import ServeConfig, config_from_args, field_docs, load_config, toml_value
from daemon.config_toml import render_toml
from tests.daemon_fixture import PROJECT_ROOT, daemon_env, sim_args, start_daemon

EXAMPLE_CONFIG = PROJECT_ROOT / "systemd" / "ascendra.toml"


def _cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "daemon.cli", *args], check=False,
                          cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_version_comes_from_the_package_metadata(capsys):
    from importlib.metadata import version
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"ascendra {version('ascendra')}"


def test_serve_help_explains_every_field_with_its_default(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100000")  # one line per option: no wrapping to undo
    serve = verb_parser(build_parser(), "serve")
    text = serve.format_help()
    # one block per option: its line, and the help argparse moves to the next line
    blocks = {}
    for line in text.split("options:", 1)[1].splitlines():
        if line.startswith("  -"):
            flag = line.split()[0].rstrip(",")
            blocks[flag] = line
        elif line.strip():
            blocks[flag] += " " + line
    for field in field_docs():
        flag = "--" + field.name.replace("_", "-")
        shown = "unset" if field.default is None else toml_value(field.default)
        assert flag in blocks, f"{flag} missing from serve --help"
        block = " ".join(blocks[flag].split())
        assert block.endswith(f"{field.description} (default: {shown})"), block


def test_boolean_fields_are_switches(tmp_path):
    parser = build_parser()
    def dropping(args) -> bool:
        return config_from_args(args).scheduler.drop_expired

    assert dropping(parser.parse_args(["serve", "--drop-expired"])) is True
    assert dropping(parser.parse_args(["serve"])) is False
    config = tmp_path / "c.toml"
    config.write_text("[scheduler]\ndrop_expired = true\n")
    assert dropping(parser.parse_args(["serve", "--config", str(config)])) is True
    assert dropping(parser.parse_args(["serve", "--config", str(config),
                                       "--no-drop-expired"])) is False
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--drop-expired", "yes"])  # a switch takes no value


def test_a_config_file_has_one_section_per_part_and_says_where_a_field_belongs(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[http]\nport = 9001\n[scheduler]\nchunk_size = 2048\n[slo]\nttft_slo = 2.0\n")
    loaded = load_config(str(config))
    assert (loaded.http.port, loaded.scheduler.chunk_size, loaded.slo.ttft_slo) == (9001, 2048, 2.0)
    config.write_text("port = 9001\n")  # the flat form of old
    with pytest.raises(ValueError, match=r"'port' is not a section; it belongs under \[http\]"):
        load_config(str(config))
    config.write_text("[scheduler]\nchunk_size = 0\n")
    with pytest.raises(ValueError, match=r"scheduler\.chunk_size"):
        load_config(str(config))
    config.write_text("[scheduler]\nmode = \"vllm\"\n")  # the layout sets it
    with pytest.raises(ValueError, match="mode"):
        load_config(str(config))


def test_a_latency_profile_without_the_sim_executor_is_an_error_naming_why():
    parser = build_parser()
    for flags, field in ((["--profile", "a100-llama3-8b"], "profile"),
                         (["--sim-latency", "constant:0.01"], "sim_latency")):
        with pytest.raises(ValueError, match=rf"{field}: only the sim executor .* --executor sim"):
            config_from_args(parser.parse_args(["serve", *flags]))
        config = config_from_args(parser.parse_args(["serve", *flags, "--executor", "sim"]))
        assert config.instances.resolved_sim_latency != "zero"


@pytest.mark.slow
def test_print_config_is_the_example_config_and_applies_flags():
    assert EXAMPLE_CONFIG.read_text() == render_toml(), (
        "systemd/ascendra.toml is stale: regenerate it with "
        "`ascendra serve --print-config > systemd/ascendra.toml`")
    assert load_config(str(EXAMPLE_CONFIG)) == ServeConfig()
    done = _cli("serve", "--print-config", "--port", "9001", "--drop-expired", "--gpus", "0,1")
    assert done.returncode == 0, done.stderr
    assert "port = 9001" in done.stdout and "drop_expired = true" in done.stdout
    assert "gpus = [0, 1]" in done.stdout


@pytest.mark.slow
def test_serve_on_a_taken_port_says_so_in_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _cli("serve", "--executor", "sim", "--port", str(port),
                    env=daemon_env(tmp_path / "cache"))
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert re.search(rf"cannot listen on 127\.0\.0\.1:{port}: address already in use$",
                     lines[0]), lines[0]
    assert not (tmp_path / "cache").exists()  # it failed before making the model


# ---- the real daemon against slow and surplus clients ----------------------------------

def _closed_after(port: int, opening: bytes, trickled: bytes, limit: float = 20.0
                  ) -> tuple[float, bytes, bool]:
    """Seconds until the daemon closes a connection that sends `opening` and then one byte
    of `trickled` a second (a slow-loris client); what it answered; and whether it closed
    before the trickle had all been sent."""
    sock = socket.create_connection(("127.0.0.1", port))
    start = time.monotonic()
    sock.sendall(opening)
    stop = threading.Event()

    sent = [0]  # bytes of `trickled` sent

    def trickle():
        for byte in trickled:
            if stop.wait(1.0):
                return
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                return
            sent[0] += 1

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    sock.settimeout(limit)
    answer = b""
    try:
        while chunk := sock.recv(4096):
            answer += chunk
    except TimeoutError:
        pytest.fail(f"the daemon still held the connection after {limit} s")
    except ConnectionResetError:
        pass
    finally:
        trickling = sent[0] < len(trickled)  # cut before it had sent it all
        stop.set()
        sock.close()
    return time.monotonic() - start, answer, trickling


@pytest.mark.slow
def test_daemon_cuts_off_slow_loris_slow_body_and_surplus_connections(tmp_path, daemon_cache):
    daemon = start_daemon(tmp_path, *sim_args(), "--header-timeout", "3", "--body-timeout", "3",
                          "--max-connections", "4", cache_dir=daemon_cache)
    try:
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        # each trickle would last 100 s or more: cut while it still goes, not before the timeout
        seconds, answer, trickling = _closed_after(daemon.port, b"",
                                                   head + b"X-Slow: " + b"a" * 100)
        print(f"slow-loris headers: connection closed after {seconds:.1f} s (header_timeout 3)")
        assert seconds >= 2.5 and trickling and answer == b""

        seconds, answer, trickling = _closed_after(
            daemon.port, head + b"Content-Length: 200\r\n\r\n", b"{" + b" " * 199)
        print(f"slow body: 408 and connection closed after {seconds:.1f} s (body_timeout 3)")
        assert seconds >= 2.5 and trickling and answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"body_timeout"' in answer

        held = [socket.create_connection(("127.0.0.1", daemon.port)) for _ in range(4)]
        time.sleep(0.5)
        with socket.create_connection(("127.0.0.1", daemon.port), timeout=5) as extra:
            assert extra.recv(4096).startswith(b"HTTP/1.1 503")
        for sock in held:
            sock.close()
        time.sleep(0.5)
        assert daemon.get_json("/health")[0] == 200  # room again, and the daemon is fine
    finally:
        daemon.close()
