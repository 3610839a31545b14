"""Prometheus metrics of the daemon, on a registry of its own (one per controller)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1, 1.5, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("ascendra_requests", "Requests by outcome", ["outcome"], registry=r)
        self.ttft = Histogram("ascendra_ttft_seconds", "Time to first token", buckets=LATENCY_BUCKETS,
                              registry=r)
        self.tbt = Histogram("ascendra_tbt_seconds", "Time between tokens", buckets=LATENCY_BUCKETS,
                             registry=r)
        self.e2e = Histogram("ascendra_e2e_seconds", "Arrival to last token",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.output_tokens = Counter("ascendra_output_tokens", "Tokens sent to clients", registry=r)
        self.waiting = Gauge("ascendra_instance_waiting", "Waiting requests", ["instance"], registry=r)
        self.running = Gauge("ascendra_instance_running", "Running requests", ["instance"], registry=r)
        self.kv_usage = Gauge("ascendra_instance_kv_usage", "Share of KV blocks in use", ["instance"],
                              registry=r)
        self.preemptions = Gauge("ascendra_instance_preemptions", "Preemptions since the instance started",
                                 ["instance"], registry=r)
        self.restarts = Counter("ascendra_instance_restarts", "Instance restarts", ["instance"], registry=r)
        self.served = Counter("ascendra_instance_served", "Requests served to the end",
                              ["instance", "role"], registry=r)
        self.perf_model_mape = Gauge("ascendra_perf_model_mape", "Performance model held-out error "
                                     "(0.1 = 10%)", ["instance"], registry=r)
        self.offloads = Counter("ascendra_offloads", "Requests moved from an LP to an HP instance",
                                registry=r)
        self.tickets = Counter("ascendra_tickets", "Tickets opened by HP instances", registry=r)
        self.dropped = Counter("ascendra_dropped", "Requests refused or dropped before their "
                               "first token, by reason (queue_full, shutting_down, no_instance, "
                               "ttft_slo_missed)", ["reason"], registry=r)
        self.recovered = Counter("ascendra_recovered", "Requests moved on after an instance died "
                                 "(resubmit: no first token yet; resume: mid-decode, by recompute) "
                                 "or an offload no HP could take (reroute)", ["kind"], registry=r)
        self.queued_requests = Gauge("ascendra_queued_requests", "Accepted requests without a "
                                     "first token yet (bounded by max_queued_requests)", registry=r)
        self.queued_tokens = Gauge("ascendra_queued_tokens", "Their prompt tokens (bounded by "
                                   "max_queued_tokens)", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
