"""Ascendra's layouts end to end: the real daemon with LP and HP instances (sim executor).

Offloads and tickets happen under load and every request still gets its answer;
with drop_expired, a request whose TTFT SLO is lost gets a 503 naming the reason.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from tests.daemon_fixture import wait_for


def metric(daemon, name: str) -> float:
    _, _, body = daemon.request("GET", "/metrics")
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def completion(daemon, **fields):
    body = {"prompt": list(range(3, 203)), "max_tokens": 10, "ignore_eos": True, **fields}
    status, _, raw = daemon.request("POST", "/v1/completions", body)
    return status, json.loads(raw)


def test_1l1h_offloads_to_hp_and_hands_out_tickets(daemon_factory):
    daemon = daemon_factory("--layout", "1L1H", "--executor", "sim",
                            "--sim-latency", "constant:0.05", "--heartbeat-interval", "0.1")
    roles = [i["role"] for i in daemon.health()["instances"]]
    assert roles == ["lp", "hp"]
    wait_for(lambda: metric(daemon, "ascendra_tickets_total") >= 1, 10, what="a first HP ticket")
    with ThreadPoolExecutor(max_workers=30) as pool:
        answers = list(pool.map(lambda _: completion(daemon, ttft_slo=0.3), range(30)))
    assert [status for status, _ in answers] == [200] * 30
    assert all(body["usage"]["completion_tokens"] == 10 for _, body in answers)
    assert metric(daemon, "ascendra_offloads_total") >= 1, "LP gave its late requests to HP"
    served = metric(daemon, 'ascendra_instance_served_total{instance="1",role="hp"}')
    assert served >= 2, "HP served offloaded and ticketed requests"
    health = wait_for(lambda: (h := daemon.health())["instances"][0]["offloaded"] and h, 5,
                      what="heartbeats with the offload count")
    assert health["requests_in_flight"] == 0
    assert health["instances"][0]["perf_model_mape"] is not None


def test_dropped_request_gets_503_with_the_reason(daemon_factory):
    daemon = daemon_factory("--layout", "1xsarathi", "--executor", "sim",
                            "--sim-latency", "constant:0.05", "--drop-expired", "true",
                            "--max-num-seqs", "1")
    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(lambda _: completion(daemon, ttft_slo=0.2), range(6)))
    statuses = sorted(status for status, _ in answers)
    assert statuses[0] == 200, "the first request is served"
    dropped = [body for status, body in answers if status == 503]
    assert dropped, "requests queued behind one slot miss their 0.2 s TTFT SLO and are dropped"
    assert all(b["error"]["code"] == "ttft_slo_missed" for b in dropped)
    assert all("TTFT SLO" in b["error"]["message"] for b in dropped)
    assert metric(daemon, 'ascendra_dropped_total{reason="ttft_slo_missed"}') == len(dropped)
