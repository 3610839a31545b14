"""Ascendra as a model server behind an inference gateway (docs/gateway_protocol.md): the
protocol's gauges against the box's real state, the SLO headers, back-pressure and probes.

Covers: daemon/gateway_view.py, daemon/gateway_metrics.py, daemon/health.py.
"""
from __future__ import annotations

import json
import signal
import socket

import pytest
from prometheus_client.parser import text_string_to_metric_families

from daemon.core.controller_config import ControllerConfig, SloConfig
from daemon.core.controller_core import ControllerCore
from daemon.core.events import Arrived, ClientLeft, FromInstance, StartAccepting
from daemon.gateway_view import GatewayView, gateway_view
from daemon.health import Probe
from daemon.request_log import read_request_log
from daemon.core.request_state import Outcome, RequestState
from daemon.slo_headers import TPOT_HEADER, TTFT_HEADER, BadSloHeader, header_slo
from ipc.messages import InstanceLoad, Ready, Role, StepOutputs, StepTokens, TokenOutput
from ipc.params import SamplingParams
from tests.api_fakes import FakeController, api_client, call, expect_error, LIMITS
from tests.test_controller_core import LP0, arrive, core_late
from tests.daemon_fixture import sim_args, wait_for

PROTOCOL_GAUGES = ("vllm:num_requests_waiting", "vllm:num_requests_running",
                   "vllm:kv_cache_usage_perc")


# ---- the view, on the controller core alone ---------------------------------------------------

def _ready(instance_id: int, role: Role, num_kv_blocks: int = 100) -> Ready:
    return Ready(instance_id=instance_id, role=role, mode=role.value, executor="sim", pid=1,
                 num_kv_blocks=num_kv_blocks, block_size=16, max_model_len=64)


def _core(roles: dict[int, Role], **config) -> ControllerCore:
    core = ControllerCore(roles, ControllerConfig(**config), SloConfig())
    for instance_id, role in roles.items():
        core.handle(FromInstance(0.0, _ready(instance_id, role)))
    core.handle(StartAccepting(0.0))
    return core


def _arrive(core: ControllerCore, request_id: str) -> list:
    return core.handle(Arrived(1.0, request_id, [5, 6, 7], SamplingParams(max_tokens=8)))


def _step(instance_id: int, num_running: int, kv_used: int, *outputs, now: float = 1.1,
          accepted: int = 0) -> FromInstance:
    """A step's end on `instance_id`: its tokens and its load after it."""
    load = InstanceLoad(accepted=accepted, queued_prefill_tokens=100, queued_prefill_seconds=0.1,
                        num_running=num_running, num_kv_blocks_used=kv_used)
    return FromInstance(now, StepOutputs(instance_id=instance_id, step=1, time=now,
                                         step_seconds=0.1, tokens=StepTokens.of(outputs), load=load))


def test_an_idle_box_shows_nothing_waiting_or_running_and_its_kv_layout():
    view = gateway_view(_core({0: Role.PEER, 1: Role.PEER}).view)
    assert view == GatewayView(num_requests_waiting=0, num_requests_running=0,
                               kv_cache_usage_perc=0.0, block_size=16, num_gpu_blocks=200)


def test_running_is_what_the_instances_report_and_the_rest_of_the_box_waits():
    core = _core({0: Role.PEER})
    for request_id in "abc":
        _arrive(core, request_id)
    assert gateway_view(core.view).num_requests_waiting == 3  # sent, not yet in a batch
    core.handle(_step(0, 2, 30, TokenOutput("a", 9), TokenOutput("b", 9)))
    view = gateway_view(core.view)
    assert (view.num_requests_running, view.num_requests_waiting) == (2, 1)
    assert view.kv_cache_usage_perc == pytest.approx(0.3)


def test_a_request_the_client_left_leaves_the_running_count_at_once():
    core = _core({0: Role.PEER})
    for request_id in "ab":
        _arrive(core, request_id)
    core.handle(_step(0, 2, 4, TokenOutput("a", 9), TokenOutput("b", 9)))
    core.handle(ClientLeft(3.0, "a", Outcome.CANCELLED))  # its batch drops it next step only
    view = gateway_view(core.view)
    assert (view.num_requests_running, view.num_requests_waiting) == (1, 0)


def test_kv_usage_is_over_every_ready_instance_of_an_lp_hp_box():
    core = _core({0: Role.LP, 1: Role.HP})
    core.handle(_step(0, 0, 50))
    assert gateway_view(core.view).kv_cache_usage_perc == pytest.approx(50 / 200)


def test_requests_waiting_at_the_controller_count_as_waiting():
    core = core_late()  # 2L1H with the global queue: each LP takes two, four wait
    for i in range(8):
        arrive(core, f"r{i}", now=1.0, prompt=[5] * 100)
    pending = sum(t.state is RequestState.PENDING for t in core.ledger.requests.values())
    assert pending == 4
    assert gateway_view(core.view).num_requests_waiting == 8
    core.handle(_step(LP0, 1, 7, TokenOutput("r0", 9), accepted=2))
    view = gateway_view(core.view)
    assert (view.num_requests_running, view.num_requests_waiting) == (1, 7)


# ---- SLO headers ----------------------------------------------------------------------------

@pytest.mark.parametrize("value, seconds", [("250", 0.25), ("1500.5", 1.5005), (" 40 ", 0.04),
                                            (".5", 0.0005), ("86400000", 86400.0)])
def test_an_slo_header_is_milliseconds(value, seconds):
    assert header_slo({TTFT_HEADER: value}, TTFT_HEADER) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["", "abc", "-5", "0", "1e3", "inf", "nan", "0x10", "86400001",
                                   "5 ms", "+5"])
def test_a_malformed_slo_header_is_refused_naming_it(value):
    with pytest.raises(BadSloHeader, match=TPOT_HEADER) as raised:
        header_slo({TPOT_HEADER: value}, TPOT_HEADER)
    assert raised.value.param == TPOT_HEADER


class RecordingController(FakeController):
    """The API's fake controller, keeping the SLOs each request reached the core with."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer)
        self.slos: list[tuple[float | None, float | None]] = []

    async def submit(self, prompt_token_ids, sampling, *, request_id, ttft_slo=None,
                     tbt_slo=None, **kwargs):
        self.slos.append((ttft_slo, tbt_slo))
        return await super().submit(prompt_token_ids, sampling, request_id=request_id)

    def liveness(self) -> Probe:
        return Probe(ok=True, reason="", instances_ready=1, instances=1)

    def readiness(self) -> Probe:
        return Probe(ok=False, reason="draining: the server is shutting down",
                     instances_ready=1, instances=1)


@pytest.mark.parametrize("body, headers, expected", [
    ({}, {TTFT_HEADER: "250", TPOT_HEADER: "40"}, (0.25, 0.04)),
    ({"ttft_slo": 2.0}, {TTFT_HEADER: "250", TPOT_HEADER: "40"}, (2.0, 0.04)),  # body wins
    ({"tbt_slo": 0.1}, {TTFT_HEADER: "250"}, (0.25, 0.1)),
    ({}, {}, (None, None)),  # neither: the server's default, applied by the core
])
async def test_slo_headers_reach_the_controller_and_the_body_wins(tokenizer, body, headers,
                                                                  expected):
    controller = RecordingController(tokenizer)
    async with api_client(controller, **LIMITS) as client:
        resp, raw = await call(client, "POST", "/v1/completions",
                               {"prompt": "Hi", "max_tokens": 2, **body}, headers)
        assert resp.status == 200, raw
    assert controller.slos == [expected]


async def test_a_malformed_slo_header_is_a_400_naming_it(tokenizer):
    controller = RecordingController(tokenizer)
    async with api_client(controller, **LIMITS) as client:
        await expect_error(client, "POST", "/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "hi"}]}, 400,
                           TTFT_HEADER, "not a number", param=TTFT_HEADER,
                           headers={TTFT_HEADER: "soon"})
    assert controller.slos == []


async def test_probes_answer_200_or_503_with_their_reason(tokenizer):
    async with api_client(RecordingController(tokenizer), **LIMITS) as client:
        live, raw = await call(client, "GET", "/livez")
        assert live.status == 200 and json.loads(raw)["ok"] is True
        ready, raw = await call(client, "GET", "/readyz")
        assert ready.status == 503 and "draining" in json.loads(raw)["reason"]


# ---- the live daemon ------------------------------------------------------------------------

def _scrape(daemon) -> dict[str, tuple[str, float]]:
    """Each protocol gauge's (type, value), and the cache info's labels."""
    status, _, raw = daemon.request("GET", "/metrics")
    assert status == 200
    found = {}
    for family in text_string_to_metric_families(raw.decode()):
        if family.name in PROTOCOL_GAUGES:
            [sample] = family.samples
            found[family.name] = (family.type, sample.value)
        elif family.name == "vllm:cache_config_info":
            [sample] = family.samples
            found[family.name] = (family.type, sample.labels)
    return found


def _consistent_snapshot(daemon) -> tuple[dict, dict]:
    """(/health, /metrics) taken while the box did not change (the same /health before
    and after the scrape), so the two can be compared exactly."""
    def attempt():
        before = daemon.health()
        metrics = _scrape(daemon)
        return (before, metrics) if daemon.health() == before else None
    return wait_for(attempt, 30, what="a scrape between two equal /health answers")


#: Targets no request of these tests misses, so none is dropped for lateness and an LP
#: instance's TBT budget does not keep its batch small with steps this slow.
PATIENT = f"{TTFT_HEADER}: 600000\r\n{TPOT_HEADER}: 600000\r\n"


def _hold(daemon, count: int, max_tokens: int = 400, headers: str = PATIENT,
          ) -> list[socket.socket]:
    """`count` streaming requests left open (nothing read), each in flight until closed."""
    body = json.dumps({"prompt": "Hello there", "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True}).encode()
    held = []
    for _ in range(count):
        sock = socket.create_connection((daemon.host, daemon.port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\n" + headers.encode() +
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        held.append(sock)
    return held


def _gauge(daemon, name: str) -> float:
    return _scrape(daemon)[name][1]


def _queued(daemon) -> int:
    return daemon.health()["queued_requests"]


@pytest.mark.slow
def test_protocol_gauges_match_the_real_state_under_load_and_a_full_box_says_retry(
        daemon_factory):
    """One instance, 2 requests to a batch, 3 to the waiting queue: the gateway sees 2
    running and 3 waiting, KV use as the instances report it; one more is a quick 503."""
    daemon = daemon_factory(*sim_args("constant:0.5"), "--max-num-seqs", "2",
                            "--max-queued-requests", "3")
    held = _hold(daemon, 2)
    try:
        wait_for(lambda: _gauge(daemon, "vllm:num_requests_running") == 2 and _queued(daemon) == 0,
                 30, what="2 requests running with their first tokens")
        held += _hold(daemon, 3)
        wait_for(lambda: _queued(daemon) == 3, 30, what="3 more waiting")
        health, metrics = _consistent_snapshot(daemon)
        assert {name: kind for name, (kind, _) in metrics.items()} == dict.fromkeys(
            [*PROTOCOL_GAUGES, "vllm:cache_config_info"], "gauge")
        [instance] = health["instances"]
        assert health["requests_in_flight"] == 5
        assert metrics["vllm:num_requests_running"][1] == instance["running"] == 2
        assert metrics["vllm:num_requests_waiting"][1] == 3 == health["queued_requests"]
        assert metrics["vllm:kv_cache_usage_perc"][1] == pytest.approx(
            instance["kv_blocks_used"] / instance["kv_blocks_total"])
        assert 0 < metrics["vllm:kv_cache_usage_perc"][1] < 1
        assert metrics["vllm:cache_config_info"][1]["block_size"] == "16"
        assert metrics["vllm:cache_config_info"][1]["num_gpu_blocks"] == str(
            instance["kv_blocks_total"])
        status, headers, raw = daemon.request("POST", "/v1/completions",
                                              {"prompt": "Hi", "max_tokens": 2})
        assert status == 503 and int(headers["retry-after"]) >= 1
        assert json.loads(raw)["error"]["code"] == "queue_full"
    finally:
        for sock in held:
            sock.close()


@pytest.mark.slow
def test_on_an_lp_hp_box_waiting_plus_running_is_every_request_in_flight(daemon_factory):
    daemon = daemon_factory(*sim_args("constant:0.5", "1L1H"), "--max-num-seqs", "2")
    held = _hold(daemon, 6)
    try:
        wait_for(lambda: _gauge(daemon, "vllm:num_requests_running") >= 1, 30,
                 what="requests running")
        health, metrics = _consistent_snapshot(daemon)
        running = sum(min(i["running"], i["in_flight"]) for i in health["instances"])
        assert metrics["vllm:num_requests_running"][1] == running
        assert metrics["vllm:num_requests_waiting"][1] == health["requests_in_flight"] - running
        assert health["requests_in_flight"] == 6
        kv_used = sum(i["kv_blocks_used"] for i in health["instances"])
        kv_total = sum(i["kv_blocks_total"] for i in health["instances"])
        assert metrics["vllm:kv_cache_usage_perc"][1] == pytest.approx(kv_used / kv_total)
    finally:
        for sock in held:
            sock.close()


@pytest.mark.slow
def test_a_draining_box_is_alive_but_not_ready_and_turns_requests_away(daemon_factory):
    daemon = daemon_factory(*sim_args("constant:0.5"), "--drain-timeout", "60")
    assert daemon.request("GET", "/readyz")[0] == 200
    assert daemon.request("GET", "/livez")[0] == 200
    held = _hold(daemon, 1)
    try:
        wait_for(lambda: daemon.health()["requests_in_flight"] == 1, 30, what="a request")
        daemon.signal(signal.SIGTERM)
        wait_for(lambda: daemon.request("GET", "/readyz")[0] == 503, 30, what="not ready")
        status, _, raw = daemon.request("GET", "/readyz")
        assert "draining" in json.loads(raw)["reason"]
        assert daemon.request("GET", "/livez")[0] == 200
        status, headers, raw = daemon.request("POST", "/v1/completions", {"prompt": "Hi"})
        assert status == 503 and "retry-after" in headers
        assert json.loads(raw)["error"]["code"] == "shutting_down"
    finally:
        for sock in held:
            sock.close()
    assert daemon.wait_exit(30) == 0


@pytest.mark.slow
def test_slo_headers_reach_the_daemons_core(daemon_factory, tmp_path):
    log = tmp_path / "requests.jsonl"
    daemon = daemon_factory(*sim_args(), "--request-log", str(log))
    status, _, raw = daemon.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2},
                                    headers={TTFT_HEADER: "300", TPOT_HEADER: "50"})
    assert status == 200, raw
    status, _, raw = daemon.request("POST", "/v1/completions",
                                    {"prompt": "Hi", "max_tokens": 2, "ttft_slo": 2.5},
                                    headers={TTFT_HEADER: "300"})
    assert status == 200, raw
    entries = wait_for(lambda: len(read_request_log(str(log))) == 2 and read_request_log(str(log)),
                       10, what="two request-log lines")
    assert sorted((e.ttft_slo, e.tbt_slo) for e in entries) == [(0.3, 0.05), (2.5, None)]
