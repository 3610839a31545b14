"""Ascendra's layouts end to end: the real daemon with LP and HP instances (sim executor).

Offloads and tickets happen under load and every request still gets its answer;
with drop_expired, a request whose TTFT SLO is lost gets a 503 naming the reason.

Covers: daemon/controller.py, daemon/core/.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.daemon_fixture import wait_for

pytestmark = pytest.mark.slow  # against a daemon subprocess


def metric(daemon, name: str) -> float:
    _, _, body = daemon.request("GET", "/metrics")
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def completion(daemon, **fields):
    body = {"prompt": list(range(3, 203)), "max_tokens": 10, "ignore_eos": True, **fields}
    status, headers, raw = daemon.request("POST", "/v1/completions", body)
    return status, headers, json.loads(raw)


def test_1l1h_offloads_to_hp_and_hands_out_tickets(daemon_factory):
    """A burst of 30 with a 0.3 s TTFT SLO on 1L1H (defaults: global queue, HP gate,
    shed = drop): the LP keeps what it can serve in time, the HP takes what it can rescue,
    and the rest is shed at once -- every request gets exactly one terminal answer."""
    daemon = daemon_factory("--layout", "1L1H", "--executor", "sim",
                            "--sim-latency", "constant:0.05", "--heartbeat-interval", "0.1")
    roles = [i["role"] for i in daemon.health()["instances"]]
    assert roles == ["lp", "hp"]
    wait_for(lambda: metric(daemon, "ascendra_tickets_total") >= 1, 10, what="a first HP ticket")
    with ThreadPoolExecutor(max_workers=30) as pool:
        answers = list(pool.map(lambda _: completion(daemon, ttft_slo=0.3), range(30)))
    served = [body for status, _, body in answers if status == 200]
    shed = [(headers, body) for status, headers, body in answers if status == 503]
    assert len(served) + len(shed) == 30, [status for status, _, _ in answers]
    assert all(body["usage"]["completion_tokens"] == 10 for body in served)
    # header names are case-insensitive (aiohttp writes this one either way)
    assert all(b["error"]["code"] == "ttft_slo_missed" and "retry-after" in map(str.lower, h)
               for h, b in shed)
    assert metric(daemon, 'ascendra_dropped_total{reason="ttft_slo_missed"}') == len(shed)
    lp = metric(daemon, 'ascendra_instance_served_total{instance="0",role="lp"}')
    hp = metric(daemon, 'ascendra_instance_served_total{instance="1",role="hp"}')
    assert lp >= 2 and hp >= 2, "both instances served part of the burst"
    assert lp + hp == len(served)
    health = wait_for(lambda: (h := daemon.health())["requests_in_flight"] == 0 and h, 30,
                      what="every request ended")
    assert health["instances"][0]["perf_model_mape"] is not None


def test_1l1h_without_the_global_queue_offloads_late_requests_to_hp(daemon_factory):
    """The paper's routing (--no-global-queue, nothing shed): requests go to the LP on
    arrival, and the LP offloads those it predicts late to the HP; all are served."""
    daemon = daemon_factory("--layout", "1L1H", "--executor", "sim", "--no-global-queue",
                            "--sim-latency", "constant:0.05", "--heartbeat-interval", "0.1")
    wait_for(lambda: metric(daemon, "ascendra_tickets_total") >= 1, 10, what="a first HP ticket")
    with ThreadPoolExecutor(max_workers=30) as pool:
        answers = list(pool.map(lambda _: completion(daemon, ttft_slo=0.3), range(30)))
    assert [status for status, _, _ in answers] == [200] * 30
    assert all(body["usage"]["completion_tokens"] == 10 for _, _, body in answers)
    assert metric(daemon, "ascendra_offloads_total") >= 1, "LP gave its late requests to HP"
    served = metric(daemon, 'ascendra_instance_served_total{instance="1",role="hp"}')
    assert served >= 2, "HP served offloaded and ticketed requests"
    health = wait_for(lambda: (h := daemon.health())["instances"][0]["offloaded"] and h, 30,
                      what="heartbeats with the offload count")
    assert health["requests_in_flight"] == 0


def test_dropped_request_gets_503_with_the_reason(daemon_factory):
    daemon = daemon_factory("--layout", "1xsarathi", "--executor", "sim",
                            "--sim-latency", "constant:0.05", "--drop-expired",
                            "--max-num-seqs", "1")
    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(lambda _: completion(daemon, ttft_slo=0.2), range(6)))
    statuses = sorted(status for status, _, _ in answers)
    assert statuses[0] == 200, "the first request is served"
    dropped = [body for status, _, body in answers if status == 503]
    assert dropped, "requests queued behind one slot miss their 0.2 s TTFT SLO and are dropped"
    assert all(b["error"]["code"] == "ttft_slo_missed" for b in dropped)
    assert all("TTFT SLO" in b["error"]["message"] for b in dropped)
    assert metric(daemon, 'ascendra_dropped_total{reason="ttft_slo_missed"}') == len(dropped)


def test_an_online_roles_layout_serves_and_shows_its_roles(daemon_factory):
    """`2A`: two instances starting as LPs, roles chosen online (docs/design.md §5.10);
    /health names each one's role, /metrics its seconds per role."""
    daemon = daemon_factory("--layout", "2A", "--executor", "sim",
                            "--sim-latency", "constant:0.01", "--heartbeat-interval", "0.1")
    instances = daemon.health()["instances"]
    assert [(i["role"], i["mode"]) for i in instances] == [("lp", "lp"), ("lp", "lp")]
    assert all(i.get("role_change") is None for i in instances)
    status, _, body = completion(daemon)
    assert status == 200 and body["usage"]["completion_tokens"] == 10
    assert metric(daemon, 'ascendra_instance_role_seconds{instance="0",role="lp"}') > 0
