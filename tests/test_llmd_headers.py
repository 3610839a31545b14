"""llm-d's request headers (pkg/epp/metadata/consts.go): the current `x-llm-d-*` names
beside their deprecated aliases (the current one wins), the queue TTL, and the
`x-llm-d-flow-queue-duration-ms` answer header; vLLM's queue-bound flags.

Covers: daemon/header_aliases.py, daemon/ttl_header.py, daemon/slo_headers.py, daemon/tenant_headers.py, daemon/core/queue_ttl.py.
"""
from __future__ import annotations

import json
import re
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from daemon.config import config_from_args
from daemon.core.controller_config import ControllerConfig, SloConfig, TenantsConfig
from daemon.core.controller_core import ControllerCore
from daemon.core.events import Arrived, FromInstance, Send, Settle, StartTimer, TimerFired
from daemon.core.request_state import Outcome
from daemon.serve_cmd import add_arguments
from daemon.slo_headers import TPOT_HEADERS, TTFT_HEADERS, BadSloHeader, header_slo
from daemon.tenant_headers import identity
from daemon.ttl_header import go_duration, header_ttl
from ipc.api_codes import EndCode
from ipc.messages import Abort, StepOutputs, StepTokens, TokenOutput
from ipc.params import SamplingParams
from ipc.tenancy import OBJECTIVE_HEADERS, QUEUE_DURATION_HEADER, TENANT_HEADERS, TTL_HEADER
from tests.api_fakes import FakeController, LIMITS, api_client, call, expect_error
from tests.daemon_fixture import sim_args, wait_for
from tests.test_controller_core import LP0, arrive, core_2l1h, core_late

NEW_TTFT, OLD_TTFT = TTFT_HEADERS
NEW_TPOT, OLD_TPOT = TPOT_HEADERS
NEW_TENANT, OLD_TENANT = TENANT_HEADERS
NEW_OBJECTIVE, OLD_OBJECTIVE = OBJECTIVE_HEADERS


class _Body:
    user = None
    priority = None


# ---- names and aliases ----------------------------------------------------------------------

@pytest.mark.parametrize("headers, seconds", [
    ({NEW_TTFT: "250"}, 0.25),
    ({OLD_TTFT: "400"}, 0.4),                    # the old name still works
    ({NEW_TTFT: "250", OLD_TTFT: "400"}, 0.25),  # both: the new one wins
    ({OLD_TPOT: "250"}, None),                   # another target's header is not this one
])
def test_the_ttft_header_under_both_names_the_new_one_winning(headers, seconds):
    got = header_slo(headers, TTFT_HEADERS)
    assert got == (None if seconds is None else pytest.approx(seconds))


def test_a_malformed_new_slo_header_is_refused_by_its_own_name_even_beside_a_good_alias():
    with pytest.raises(BadSloHeader) as raised:
        header_slo({NEW_TPOT: "soon", OLD_TPOT: "40"}, TPOT_HEADERS)
    assert raised.value.param == NEW_TPOT


@pytest.mark.parametrize("headers, tenant, priority", [
    ({NEW_TENANT: "team-a"}, "team-a", 0),
    ({OLD_TENANT: "team-b"}, "team-b", 0),
    ({NEW_TENANT: "team-a", OLD_TENANT: "team-b"}, "team-a", 0),
    ({NEW_OBJECTIVE: "batch"}, "default", -1),
    ({OLD_OBJECTIVE: "batch"}, "default", -1),
    ({NEW_OBJECTIVE: "chat", OLD_OBJECTIVE: "batch"}, "default", 5),
])
def test_tenant_and_objective_under_both_names_the_new_one_winning(headers, tenant, priority):
    tenants = TenantsConfig(objective_priorities={"batch": -1, "chat": 5})
    who = identity(_Body(), headers, tenants)
    assert (who.tenant, who.priority) == (tenant, priority)


# ---- the queue TTL --------------------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [("1500ms", 1.5), ("2s", 2.0), ("1m30s", 90.0),
                                           ("0.5s", 0.5), ("250us", 250e-6), ("1h", 3600.0),
                                           ("0", 0.0), ("0s", 0.0)])
def test_a_ttl_is_a_go_duration(text, seconds):
    assert go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["", "1500", "-1s", "+1s", "1.5 s", "soon", "1d", "25h"])
def test_a_malformed_ttl_is_refused_naming_the_header(value):
    with pytest.raises(BadSloHeader, match=TTL_HEADER) as raised:
        header_ttl({TTL_HEADER: value})
    assert raised.value.param == TTL_HEADER


def test_a_zero_ttl_is_no_ttl_and_an_absent_one_too():
    assert header_ttl({TTL_HEADER: "0s"}) is None
    assert header_ttl({}) is None


def _ttl_timers(actions) -> list[StartTimer]:
    return [a for a in actions if isinstance(a, StartTimer) and a.timer.kind == "ttl"]


def test_a_request_still_in_an_instances_queue_past_its_ttl_ends_and_is_aborted_there():
    core = core_2l1h()
    actions = core.handle(Arrived(1.0, "r", [5, 6, 7], SamplingParams(max_tokens=4), ttl=0.5))
    [timer] = _ttl_timers(actions)
    assert timer.at == pytest.approx(1.5)
    [(holder, _)] = [(a.instance_id, a.message) for a in actions if isinstance(a, Send)]
    out = core.handle(TimerFired(1.5, timer.timer))
    [settle] = [a for a in out if isinstance(a, Settle)]
    assert (settle.outcome, settle.code) == (Outcome.DROPPED, EndCode.TTL_EXPIRED)
    assert "TTL" in settle.message and settle.retry_after >= 1
    assert any(isinstance(a, Send) and a.instance_id == holder and isinstance(a.message, Abort)
               for a in out)
    assert "r" not in core.ledger.requests


def test_a_request_that_started_before_its_ttl_keeps_running():
    core = core_2l1h()
    actions = core.handle(Arrived(1.0, "r", [5, 6, 7], SamplingParams(max_tokens=4), ttl=0.5))
    [timer] = _ttl_timers(actions)
    [holder] = [a.instance_id for a in actions if isinstance(a, Send)]
    core.handle(FromInstance(1.2, StepOutputs(instance_id=holder, step=1, time=1.2,
                                              step_seconds=0.1, admitted=["r"],
                                              tokens=StepTokens.of([TokenOutput("r", 9)]))))
    out = core.handle(TimerFired(1.5, timer.timer))
    assert not [a for a in out if isinstance(a, Settle)]
    assert "r" in core.ledger.requests


def test_a_request_in_the_waiting_room_past_its_ttl_ends_there():
    core = core_late()   # each LP takes two; the rest wait at the controller
    for i in range(4):
        arrive(core, f"r{i}", prompt=[5] * 100)
    actions = core.handle(Arrived(1.0, "late", [5] * 100, SamplingParams(max_tokens=4), ttl=0.2))
    assert not [a for a in actions if isinstance(a, Send) and a.message.request_id == "late"]
    [timer] = _ttl_timers(actions)
    out = core.handle(TimerFired(1.2, timer.timer))
    [settle] = [a for a in out if isinstance(a, Settle)]
    assert settle.request_id == "late" and settle.code is EndCode.TTL_EXPIRED
    assert not [a for a in out if isinstance(a, Send)]   # no instance held it


def test_requests_without_a_ttl_start_no_ttl_timer():
    assert not _ttl_timers(arrive(core_2l1h(), "r"))


# ---- the API: what reaches the controller -----------------------------------------------------

class TtlController(FakeController):
    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer)
        self.ttls: list[float | None] = []

    async def submit(self, prompt_token_ids, sampling, *, request_id, ttl=None, **kwargs):
        self.ttls.append(ttl)
        return await super().submit(prompt_token_ids, sampling, request_id=request_id, **kwargs)


async def test_the_ttl_header_reaches_the_controller_and_a_bad_one_is_a_400(tokenizer):
    controller = TtlController(tokenizer)
    async with api_client(controller, **LIMITS) as client:
        resp, raw = await call(client, "POST", "/v1/completions",
                               {"prompt": "Hi", "max_tokens": 2}, {TTL_HEADER: "1500ms"})
        assert resp.status == 200, raw
        await expect_error(client, "POST", "/v1/completions", {"prompt": "Hi"}, 400,
                           TTL_HEADER, param=TTL_HEADER, headers={TTL_HEADER: "1500"})
    assert controller.ttls == [pytest.approx(1.5)]


# ---- vLLM's queue-bound flags ------------------------------------------------------------------

def test_vllms_queue_bound_flags_set_our_admission_bounds():
    import argparse
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--max-num-queued-reqs", "7", "--max-num-queued-tokens", "900"])
    controller = config_from_args(args).controller
    assert (controller.max_queued_requests, controller.max_queued_tokens) == (7, 900)


# ---- the live daemon ------------------------------------------------------------------------

def _post(daemon, body: dict, headers: dict) -> tuple[int, dict, bytes]:
    """A POST whose answer headers are read whole (urllib, not the fixture's helper)."""
    request = urllib.request.Request(f"{daemon.base_url}/v1/completions",
                                     json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, {k.lower(): v for k, v in answer.headers.items()}, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def _dropped(daemon) -> dict[str, float]:
    _, _, raw = daemon.request("GET", "/metrics")
    return {s.labels["reason"]: s.value for f in text_string_to_metric_families(raw.decode())
            if f.name == "ascendra_dropped" for s in f.samples if s.name.endswith("_total")}


@pytest.mark.slow
def test_a_live_daemon_answers_the_queue_time_and_ends_a_request_past_its_ttl(daemon_factory):
    """One sequence at a time with 0.3 s steps: a request queued behind a long one and a
    second waiter; with a 200 ms TTL it ends with 503 ttl_expired (counted) while they run;
    without one it waits and its answer says how long, in ms. Each request is sent once the
    one before it is in flight, so the queue's order is the test's, however slow the box."""
    from concurrent.futures import ThreadPoolExecutor
    daemon = daemon_factory(*sim_args("constant:0.3"), "--max-num-seqs", "1",
                            "--max-num-queued-reqs", "8")
    long = {"prompt": "Hello", "max_tokens": 12, "ignore_eos": True}
    short = {"prompt": "Hi", "max_tokens": 2}
    patient = {NEW_TTFT: "600000", NEW_TPOT: "600000"}

    def in_flight(n: int) -> None:
        wait_for(lambda: daemon.health()["requests_in_flight"] == n, 30, what=f"{n} in flight")

    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(_post, daemon, long, patient)
        in_flight(1)
        waiter = pool.submit(_post, daemon, short, patient)
        in_flight(2)
        expiring = pool.submit(_post, daemon, short, {**patient, TTL_HEADER: "200ms"})
        status, headers, raw = expiring.result(60)
        assert status == 503, raw
        assert json.loads(raw)["error"]["code"] == "ttl_expired"
        assert int(headers["retry-after"]) >= 1
        status, headers, raw = waiter.result(60)
        assert status == 200, raw
        assert int(headers[QUEUE_DURATION_HEADER]) >= 300   # it waited behind the first
        status, headers, raw = first.result(60)
        assert status == 200 and re.fullmatch(r"\d+", headers[QUEUE_DURATION_HEADER])
    assert _dropped(daemon).get("ttl_expired") == 1.0
    # streamed: the header comes with the first bytes
    status, headers, raw = _post(daemon, {**short, "stream": True}, patient)
    assert status == 200 and QUEUE_DURATION_HEADER in headers
