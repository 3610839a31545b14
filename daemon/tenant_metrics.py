"""Per-tenant series in /metrics, with a bounded label set.

A tenant id comes from a client header, so its label values must not grow without
bound: every tenant named in [tenants] tenant_weights has a label of its own, and so
do the first `metrics_tenants` others to send a request; everyone after them counts as
tenant="other". A label, once given, is kept (a Prometheus counter must not move
between series), so with more tenants than labels the first to arrive keep theirs --
name the tenants that matter in tenant_weights.

Counted when a request settles (its Settle carries the tenant, its output tokens and
its TTFT): requests by outcome, prompt and output tokens, and the TTFT histogram.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from daemon.core.controller_config import TenantsConfig
from daemon.core.events import Settle

OTHER = "other"
MAX_LABEL_LEN = 128


class TenantMetrics:
    def __init__(self, registry: CollectorRegistry, config: TenantsConfig,
                 buckets: tuple[float, ...]) -> None:
        self.named = set(config.tenant_weights)
        self.limit = config.metrics_tenants
        self.labelled: set[str] = set()   # tenants given a label beyond the named ones
        self.requests = Counter("ascendra_tenant_requests", "Requests by tenant and outcome",
                                ["tenant", "outcome"], registry=registry)
        self.tokens = Counter("ascendra_tenant_tokens", "Prompt and output tokens of settled "
                              "requests, by tenant", ["tenant", "kind"], registry=registry)
        self.ttft = Histogram("ascendra_tenant_ttft_seconds", "Time to first token, by tenant",
                              ["tenant"], buckets=buckets, registry=registry)

    def label(self, tenant: str) -> str:
        """The tenant's label: its own (named, or among the first `limit` others; at most
        MAX_LABEL_LEN characters of it), else "other"."""
        tenant = tenant[:MAX_LABEL_LEN]
        if tenant in self.named or tenant in self.labelled:
            return tenant
        if len(self.labelled) < self.limit and tenant != OTHER:
            self.labelled.add(tenant)
            return tenant
        return OTHER

    def settled(self, settle: Settle) -> None:
        label = self.label(settle.tenant)
        self.requests.labels(label, settle.outcome.value).inc()
        self.tokens.labels(label, "prompt").inc(settle.prompt_tokens)
        self.tokens.labels(label, "output").inc(settle.output_tokens)
        if settle.ttft is not None:
            self.ttft.labels(label).observe(settle.ttft)

    def refused(self, tenant: str) -> None:
        """A request of `tenant` turned away at the door (the reason is in
        ascendra_dropped_total)."""
        self.requests.labels(self.label(tenant), "refused").inc()
