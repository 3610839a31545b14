"""Per-tenant series in /metrics keep a bounded label set (daemon/tenant_metrics.py).

Covers: daemon/tenant_metrics.py.
"""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from daemon.core.controller_config import TenantsConfig
from daemon.core.events import Settle
from daemon.core.request_state import Outcome
from daemon.metrics import Metrics
from ipc.api_codes import EndCode


def scrape(metrics: Metrics) -> dict[tuple[str, str, str], float]:
    """(sample name, tenant, outcome or kind) -> value, for the tenant series."""
    found = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            if "tenant" in sample.labels and not sample.name.endswith("_created"):
                key = sample.labels.get("outcome") or sample.labels.get("kind", "")
                found[(sample.name, sample.labels["tenant"], key)] = sample.value
    return found


def settle(request_id: str, tenant: str, outcome=Outcome.COMPLETED) -> Settle:
    code = EndCode.TTFT_SLO_MISSED if outcome is Outcome.DROPPED else None
    return Settle(request_id, outcome, code, prompt_tokens=10, tenant=tenant, output_tokens=4,
                  ttft=0.2 if outcome is Outcome.COMPLETED else None)


def test_named_tenants_and_the_first_others_get_labels_the_rest_count_as_other():
    metrics = Metrics(tenants=TenantsConfig(tenant_weights={"vip": 2.0}, metrics_tenants=2))
    for i, tenant in enumerate(["a", "b", "c", "d", "vip", "a"]):
        metrics.observe(settle(f"r{i}", tenant))
    metrics.observe(settle("r9", "e", Outcome.DROPPED))
    seen = scrape(metrics)
    tenants = {t for _, t, _ in seen}
    assert tenants == {"a", "b", "vip", "other"}
    assert seen[("ascendra_tenant_requests_total", "a", "completed")] == 2
    assert seen[("ascendra_tenant_requests_total", "other", "completed")] == 2   # c, d
    assert seen[("ascendra_tenant_requests_total", "other", "dropped")] == 1
    assert seen[("ascendra_tenant_tokens_total", "a", "output")] == 8
    assert seen[("ascendra_tenant_tokens_total", "a", "prompt")] == 20
    assert seen[("ascendra_tenant_ttft_seconds_count", "vip", "")] == 1
