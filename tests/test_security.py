"""Security defaults: loopback unless told otherwise; an API key (flag, config or
$ASCENDRA_API_KEY) guards every route but /health, /metrics and /openapi.json, compared
in constant time; IPC sockets in a 0700 directory; no pickle anywhere; limits on body
size, max_tokens and prompt length; a tightened systemd unit.

The HTTP checks run the real app in-process (tests/api_fakes.py); the runtime directory of
a running daemon and the environment key end to end are in test_ipc_garbage.py and
test_api_fuzz.py; the limits themselves in test_api_input.py.

Covers: daemon/http_guard.py, daemon/api.py, ipc/channel.py.
"""
from __future__ import annotations

import argparse
import ast
import asyncio
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from daemon import api
from daemon.api import PUBLIC_PATHS, resolve_api_key
from daemon.config import HttpConfig, ServeConfig, config_from_args, load_config
from ipc.channel import make_runtime_dir
from tests.api_fakes import FakeController, api_client
from tests.daemon_fixture import PROJECT_ROOT

KEY = "s3cret-key-9a7b"
GOOD = {"Authorization": f"Bearer {KEY}"}
BAD_AUTH = [
    {},
    {"Authorization": ""},
    {"Authorization": "Bearer"},
    {"Authorization": "Bearer "},
    {"Authorization": "Bearer wrong"},
    {"Authorization": KEY},                        # no scheme
    {"Authorization": f"Basic {KEY}"},             # another scheme
    {"Authorization": f"Bearer {KEY}x"},           # longer
    {"Authorization": f"Bearer {KEY[:-1]}"},       # a prefix
    {"Authorization": f"Bearer {KEY.upper()}"},    # keys are case-sensitive
    {"X-Api-Key": KEY},                            # not a header we read
]
UNIT = PROJECT_ROOT / "systemd" / "ascendra.service"
EXAMPLE_CONFIG = PROJECT_ROOT / "systemd" / "ascendra.toml"
SOURCE_ROOTS = ["daemon", "engines", "ipc", "policies", "bench"]


@pytest.fixture
async def client(tokenizer):
    async with api_client(FakeController(tokenizer), api_key=KEY) as c:
        yield c


# ---- listen on loopback unless told otherwise ---------------------------------------------

def test_default_host_is_loopback_everywhere():
    assert ServeConfig().http.host == "127.0.0.1"
    assert load_config().http.host == "127.0.0.1"
    assert load_config(str(EXAMPLE_CONFIG)).http.host == "127.0.0.1"
    parser = _serve_parser()
    assert config_from_args(parser.parse_args(["serve"])).http.host == "127.0.0.1"
    assert config_from_args(parser.parse_args(["serve", "--host", "0.0.0.0"])).http.host == "0.0.0.0"


def _serve_parser() -> argparse.ArgumentParser:
    """`ascendra serve`'s flags, as daemon.cli registers them."""
    from daemon.cli import build_parser
    return build_parser()


@pytest.mark.parametrize("host,loopback", [("127.0.0.1", True), ("::1", True),
                                           ("localhost", True), ("0.0.0.0", False),
                                           ("::", False), ("10.1.2.3", False)])
def test_a_non_loopback_host_without_a_key_is_warned_about(host, loopback):
    from daemon.serve_cmd import _is_loopback
    assert _is_loopback(host) is loopback


# ---- the API key ----------------------------------------------------------------------------

def test_the_key_comes_from_the_config_or_the_environment():
    assert resolve_api_key(HttpConfig(), {}) == ""
    assert resolve_api_key(HttpConfig(), {"ASCENDRA_API_KEY": "from-env"}) == "from-env"
    assert resolve_api_key(HttpConfig(api_key="from-flag"),
                           {"ASCENDRA_API_KEY": "from-env"}) == "from-flag"


async def test_every_route_but_the_public_ones_needs_the_key(client):
    routes = {(r.method, r.resource.canonical) for r in client.server.app.router.routes()
              if r.method != "HEAD"}
    guarded = {(m, p) for m, p in routes if p not in PUBLIC_PATHS}
    assert {("GET", "/v1/models"), ("POST", "/v1/completions"),
            ("POST", "/v1/chat/completions")} <= guarded
    assert {p for _, p in routes} - {p for _, p in guarded} == PUBLIC_PATHS
    for method, route in sorted(guarded):
        path = route.replace("{model}", "tiny")  # GET /v1/models/{model}: the served one
        for headers in BAD_AUTH:
            resp = await client.request(method, path, headers=headers, json={"prompt": "Hi"})
            assert resp.status == 401, (method, path, headers)
            body = await resp.json()
            assert body["error"]["type"] == "authentication_error"
            assert body["error"]["code"] == "invalid_api_key"
            assert KEY not in await resp.text()
        body = ({"prompt": "Hi"} if path == "/tokenize" else {
            "prompt": "Hi", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
        resp = await client.request(method, path, headers=GOOD, json=body)
        assert resp.status == 200, (method, path, await resp.text())


async def test_the_scheme_is_case_insensitive(client):
    for scheme in ("bearer", "BEARER", "Bearer"):
        resp = await client.get("/v1/models", headers={"Authorization": f"{scheme} {KEY}"})
        assert resp.status == 200


@pytest.mark.parametrize("path", sorted(PUBLIC_PATHS))
async def test_health_metrics_and_openapi_are_public(client, path):
    resp = await client.get(path)
    assert resp.status == 200


async def test_public_openapi_says_v1_needs_the_bearer_key(client):
    spec = await (await client.get("/openapi.json")).json()
    assert spec["components"]["securitySchemes"] == {"bearer": {"type": "http",
                                                                "scheme": "bearer"}}
    assert spec["paths"]["/v1/models"]["get"]["security"] == [{"bearer": []}]
    assert "security" not in spec["paths"]["/health"]["get"]


@pytest.mark.parametrize("method,path", [("GET", "/admin"), ("GET", "/v1"), ("GET", "/v1/"),
                                         ("GET", "/v1/nothing"), ("POST", "/health"),
                                         ("DELETE", "/v1/models")])
async def test_unknown_routes_and_methods_reveal_nothing_without_the_key(client, method, path):
    resp = await client.request(method, path)
    assert resp.status == 401
    resp = await client.request(method, path, headers=GOOD)
    assert resp.status in (404, 405)


async def _raw_http(client, request: bytes) -> tuple[int, bytes]:
    """Bytes as they are on the wire (no client-side URL or header normalisation)."""
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    try:
        writer.write(request)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    return int(data.split(b" ", 2)[1]), data


@pytest.mark.parametrize("target", ["/v1//models", "//v1/models", "/V1/models", "/%761/models",
                                    "/v1/%6dodels", "/health/../v1/models", "/v1/./models",
                                    "/v1/models?x=/health", "/health%2f..%2fv1/models",
                                    "http://127.0.0.1/v1/models"])
async def test_path_tricks_never_skip_the_key(client, target):
    status, data = await _raw_http(client, f"GET {target} HTTP/1.1\r\nHost: x\r\n"
                                           f"Connection: close\r\n\r\n".encode())
    assert status == 401 or status >= 404, data  # never served without the key
    assert status != 200


async def test_non_utf8_authorization_bytes_are_a_401_not_a_crash(client):
    status, data = await _raw_http(client, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
                                           b"Authorization: Bearer \xff\xfe\x80key\r\n"
                                           b"Connection: close\r\n\r\n")
    assert status == 401, data
    assert b"authentication_error" in data


async def test_the_key_is_compared_in_constant_time_on_fixed_length_digests(client, monkeypatch):
    import hmac
    calls, real = [], hmac.compare_digest

    def spy(a, b):
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(api.hmac, "compare_digest", spy)
    for headers in (GOOD, {"Authorization": "Bearer x"}, {"Authorization": "Bearer " + "y" * 999},
                    {}):
        await client.get("/v1/models", headers=headers)
    assert calls == [(32, 32)] * 4  # every attempt compared, SHA-256 digests: no length leak


async def test_no_key_configured_means_no_authentication(tokenizer):
    async with api_client(FakeController(tokenizer)) as client:
        assert (await client.get("/v1/models")).status == 200


def test_api_doc_documents_the_public_routes_and_the_key():
    api_doc = (PROJECT_ROOT / "docs" / "api.md").read_text()
    section = api_doc[api_doc.index("## Input limits and security"):]
    for word in ("127.0.0.1", "ASCENDRA_API_KEY", "Authorization: Bearer", "/health",
                 "/metrics", "/openapi.json", "0700", "pickle", "413", "max_tokens_limit"):
        assert word in section, word


# ---- the IPC sockets' directory -------------------------------------------------------------

def test_runtime_dir_is_0700_whatever_the_umask(tmp_path, monkeypatch):
    old = os.umask(0)
    try:
        path = make_runtime_dir(tmp_path / "a" / "b")
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
        monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
        temp = make_runtime_dir()
        assert temp.parent == tmp_path and stat.S_IMODE(os.stat(temp).st_mode) == 0o700
    finally:
        os.umask(old)


def test_runtime_dir_of_another_user_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "theirs"
    path.mkdir(mode=0o700)
    real_lstat = os.lstat

    def lstat(p, *a, **kw):
        st = real_lstat(p, *a, **kw)
        if Path(p) == path:
            return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink,
                                   os.geteuid() + 1, st.st_gid, st.st_size, 0, 0, 0))
        return st

    monkeypatch.setattr(os, "lstat", lstat)
    with pytest.raises(PermissionError, match="belongs to uid"):
        make_runtime_dir(path)


# ---- no pickle ------------------------------------------------------------------------------

#: Modules that deserialize arbitrary objects (code execution on load).
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve",
                  "joblib", "multiprocessing"}


def _python_files():
    for root in SOURCE_ROOTS:
        yield from sorted((PROJECT_ROOT / root).rglob("*.py"))


@pytest.mark.slow
def test_no_module_imports_pickle_or_unpickles():
    problems = []
    for path in _python_files():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            problems += [f"{path}:{node.lineno} imports {n}" for n in names if n in UNSAFE_MODULES]
            # Calls that unpickle: zmq's *_pyobj, torch.load, numpy's allow_pickle loads.
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = ast.unparse(node.func.value)
                attr = node.func.attr
                if attr in ("recv_pyobj", "send_pyobj", "recv_serialized") or \
                        (attr == "load" and owner in ("torch", "np", "numpy")) or \
                        (attr in ("loads", "load") and owner in UNSAFE_MODULES) or \
                        any(k.arg == "allow_pickle" for k in node.keywords):
                    problems.append(f"{path}:{node.lineno} calls {owner}.{attr}")
    assert not problems, problems
    assert len(list(_python_files())) > 50  # the walk did see the code


def test_the_wire_is_msgpack_of_typed_structs():
    text = (PROJECT_ROOT / "ipc" / "codec.py").read_text()
    assert "msgspec.msgpack.Decoder(union)" in text
    channel = (PROJECT_ROOT / "ipc" / "channel.py").read_text()
    assert "_pyobj" not in channel and "ipc://" in channel
    assert "only ipc:// endpoints are allowed" in channel  # never tcp://


def test_instances_get_their_config_as_json_not_pickle():
    from engines.instance_launch import instance_command
    from tests.test_instance import sim_config
    command = instance_command(sim_config("ipc:///tmp/x/controller.sock"))
    assert any(arg.lstrip().startswith("{") for arg in command), command


# ---- limits ---------------------------------------------------------------------------------

def test_limits_have_bounded_defaults():
    config = ServeConfig().http
    assert config.max_body_bytes <= 1 << 20
    assert config.max_tokens_limit <= 4096 and config.default_max_tokens <= config.max_tokens_limit
    from daemon.openai_schema import ChatCompletionRequest, CompletionRequest
    assert {"max_tokens", "seed", "top_k", "priority", "ttft_slo"} <= set(
        CompletionRequest.__struct_fields__)
    assert "messages" in ChatCompletionRequest.__struct_fields__


# ---- the systemd unit -----------------------------------------------------------------------

def _unit() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def test_unit_is_hardened():
    unit = _unit()
    for key, value in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                       ("ProtectHome", "yes"), ("PrivateTmp", "yes"), ("PrivateMounts", "yes"),
                       ("ProtectKernelTunables", "yes"), ("ProtectKernelModules", "yes"),
                       ("ProtectKernelLogs", "yes"), ("ProtectControlGroups", "yes"),
                       ("ProtectClock", "yes"), ("ProtectHostname", "yes"),
                       ("ProtectProc", "invisible"), ("RestrictNamespaces", "yes"),
                       ("RestrictRealtime", "yes"), ("RestrictSUIDSGID", "yes"),
                       ("LockPersonality", "yes"), ("RemoveIPC", "yes"),
                       ("SystemCallArchitectures", "native"), ("CapabilityBoundingSet", ""),
                       ("UMask", "0077"), ("DevicePolicy", "closed"),
                       ("RuntimeDirectoryMode", "0700"), ("SystemCallErrorNumber", "EPERM"),
                       ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
                       ("IPAddressDeny", "any"), ("IPAddressAllow", "localhost")]:
        assert unit.get(key) == [value], (key, unit.get(key))
    assert unit["SystemCallFilter"] == ["@system-service", "~@privileged"]
    assert all(d.startswith(("/dev/nvidia", "char-nvidia")) for d in unit["DeviceAllow"])
    assert "MemoryDenyWriteExecute" not in unit  # breaks PyTorch JIT / CUDA (see the comment)
    assert "MemoryDenyWriteExecute=yes" in UNIT.read_text()  # ... which explains why
    assert unit["User"] == ["ascendra"]


def test_systemd_analyze_security_exposure_is_low(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    unit = tmp_path / "ascendra.service"
    unit.write_text(UNIT.read_text())
    done = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", str(unit)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "SYSTEMD_PAGER": "cat", "LC_ALL": "C"})
    output = done.stdout + done.stderr
    match = re.search(r"Overall exposure level for ascendra\.service: ([0-9.]+)", output)
    if match is None and "offline" in output:
        pytest.skip(f"this systemd-analyze cannot analyse offline: {output[-300:]}")
    assert match, output
    exposure = float(match.group(1))
    assert exposure <= 1.5, output  # 3.5 before the unit was tightened
    recorded = re.search(r"exposure [0-9.]+ OK\n# before this block was tightened, ([0-9.]+) OK",
                         UNIT.read_text())
    assert recorded and float(recorded.group(1)) == exposure  # the unit's comment is current


def test_unit_listens_where_the_config_does():
    # IPAddressAllow=localhost matches the loopback default; both must be changed together.
    assert _unit()["IPAddressAllow"] == ["localhost"]
    assert load_config(str(EXAMPLE_CONFIG)).http.host == "127.0.0.1"
    text = UNIT.read_text()
    assert "set host in /etc/ascendra/ascendra.toml AND allow their networks here" in text
