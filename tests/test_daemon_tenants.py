"""Tenants end to end: a flooding tenant cannot starve another on a live daemon (sim
executor), and /metrics counts each tenant's requests (daemon/tenant_headers.py,
policies/tenants.py).

Covers: daemon/tenant_headers.py, policies/tenants.py.
"""
from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ipc.tenancy import TENANT_HEADER
from tests.daemon_fixture import wait_for

pytestmark = pytest.mark.slow  # against a daemon subprocess

FLOOD, LIGHT = 40, 8   # heavy's clients, each sending again at once; light's requests
_PROMPTS = itertools.count()


def completion(daemon, tenant: str) -> int:
    """A 1,000-token prompt of its own (no prefix shared with another), due in 0.3 s:
    the answer's status."""
    first = next(_PROMPTS)
    body = {"prompt": [3 + (first + i) % 250 for i in range(1000)], "max_tokens": 8,
            "ignore_eos": True, "ttft_slo": 0.3}
    return daemon.request("POST", "/v1/completions", body, headers={TENANT_HEADER: tenant})[0]


def flood_with_a_light_tenant(daemon) -> tuple[list[int], list[int]]:
    """`FLOOD` clients of tenant heavy send one request after another while tenant light
    sends `LIGHT`, one at a time. Returns each tenant's statuses."""
    heavy: list[int] = []
    done = threading.Event()

    def client(_):
        while not done.is_set():
            heavy.append(completion(daemon, "heavy"))

    with ThreadPoolExecutor(max_workers=FLOOD) as pool:
        clients = [pool.submit(client, i) for i in range(FLOOD)]
        time.sleep(0.5)   # the flood is under way
        light = [completion(daemon, "light") for _ in range(LIGHT)]
        done.set()
        for c in clients:
            c.result()
    return heavy, light


@pytest.mark.parametrize("fair", [True, False])
def test_a_flooding_tenant_cannot_starve_another(daemon_factory, fair):
    daemon = daemon_factory("--layout", "1L1H", "--executor", "sim",
                            "--sim-latency", "constant:0.05", "--heartbeat-interval", "0.1",
                            "--fair-share" if fair else "--no-fair-share")
    heavy, light = flood_with_a_light_tenant(daemon)
    assert set(heavy) <= {200, 503}
    assert heavy.count(503) >= len(heavy) // 4, "the flood saturates the box"
    # The flood's 40 clients starve this host's CPUs: the instances' measured rates dip
    # now and then, and a light request may be predicted late once (seen about one run
    # in six on a busy 2-core host). Blind, the light tenant loses about as much as the
    # heavy one (half to seven-eighths of its requests in six runs).
    if fair:
        assert light.count(200) >= LIGHT - 1, "the light tenant is served (nearly) in full"
    else:
        assert light.count(503) >= 2, "tenant-blind shedding: the light tenant pays too"
    # /metrics counts each tenant's answers as its clients saw them (blind, the light
    # tenant may lose every request: then it has no "completed" line, and counts 0).
    for tenant, statuses in (("heavy", heavy), ("light", light)):
        seen = (statuses.count(200), len(statuses))
        try:
            wait_for(lambda: _tenant_requests(daemon, tenant) == seen, 5)
        except TimeoutError:
            assert _tenant_requests(daemon, tenant) == seen, f"tenant {tenant} on /metrics"


def _tenant_requests(daemon, tenant: str) -> tuple[int, int]:
    """(completed, all) of `ascendra_tenant_requests_total` for `tenant`, from /metrics."""
    _, _, body = daemon.request("GET", "/metrics")
    completed = total = 0
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == "ascendra_tenant_requests_total" \
                    and sample.labels.get("tenant") == tenant:
                total += int(sample.value)
                completed += int(sample.value) if sample.labels["outcome"] == "completed" else 0
    return completed, total
