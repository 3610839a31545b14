"""Prometheus metrics of the daemon, on a registry of its own (one per controller).

They observe the controller core's actions (`observe`): the same stream the simulator's
per-request records are built from, so both count the same things. Tokens, tens of
thousands a second, are counted a step at a time (`observe_tokens`: one counter step
and one pass over the TTFT/TBT histograms, daemon/batch_histogram.py, per `Tokens`). The
model-server protocol's `vllm:*` gauges an inference gateway scrapes are read from the
core at scrape time (`watch_gateway`, daemon/gateway_metrics.py).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from daemon.batch_histogram import BatchHistogram
from daemon.core.events import (EspChanged, Moved, Refuse, RoleSwitched, Settle, TicketOpened,
                                Tokens)
from daemon.gateway_metrics import GatewayCollector
from daemon.gateway_view import GatewayView
from daemon.prefix_metrics import PrefixCacheMetrics
from daemon.tenant_metrics import TenantMetrics
from daemon.core.controller_config import TenantsConfig
from daemon.core.request_state import Outcome
from ipc.messages import Heartbeat, Origin, Ready, Role

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1, 1.5, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self, roles: Mapping[int, Role] | None = None,
                 tenants: TenantsConfig = TenantsConfig()) -> None:
        self.roles = dict(roles or {})
        self.registry = CollectorRegistry()
        r = self.registry
        self.tenants = TenantMetrics(r, tenants, LATENCY_BUCKETS)
        self.requests = Counter("ascendra_requests", "Requests by outcome", ["outcome"], registry=r)
        self.ttft = BatchHistogram("ascendra_ttft_seconds", "Time to first token",
                                   LATENCY_BUCKETS, registry=r)
        self.tbt = BatchHistogram("ascendra_tbt_seconds", "Time between tokens",
                                  LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("ascendra_e2e_seconds", "Arrival to last token",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.output_tokens = Counter("ascendra_output_tokens", "Tokens sent to clients", registry=r)
        self.waiting = Gauge("ascendra_instance_waiting", "Waiting requests", ["instance"], registry=r)
        self.running = Gauge("ascendra_instance_running", "Running requests", ["instance"], registry=r)
        self.kv_usage = Gauge("ascendra_instance_kv_usage", "Share of KV blocks in use", ["instance"],
                              registry=r)
        self.model_kv_blocks = Gauge(
            "ascendra_instance_model_kv_blocks",
            "A multiplexed instance: KV blocks (the model's own) its requests of each model hold",
            ["instance", "model"], registry=r)
        self.preemptions = Gauge("ascendra_instance_preemptions", "Preemptions since the instance started",
                                 ["instance"], registry=r)
        self.restarts = Counter("ascendra_instance_restarts", "Instance restarts", ["instance"], registry=r)
        self.served = Counter("ascendra_instance_served", "Requests served to the end",
                              ["instance", "role"], registry=r)
        self.perf_model_mape = Gauge("ascendra_perf_model_mape", "Performance model held-out error "
                                     "(0.1 = 10%)", ["instance"], registry=r)
        self.offloads = Counter("ascendra_offloads", "Requests sent to an HP instance before "
                                "their prefill: an LP's offload or the waiting room's rescue",
                                registry=r)
        self.tickets = Counter("ascendra_tickets", "Tickets opened by HP instances", registry=r)
        self.dropped = Counter("ascendra_dropped", "Requests refused or dropped before their "
                               "first token, by reason (queue_full, starting, shutting_down, "
                               "no_instance, ttft_slo_missed, ttl_expired)", ["reason"], registry=r)
        self.recovered = Counter("ascendra_recovered", "Requests moved on after an instance died "
                                 "(resubmit: no first token yet; resume: mid-decode, by recompute) "
                                 "or an offload no HP could take (reroute)", ["kind"], registry=r)
        self.queued_requests = Gauge("ascendra_queued_requests", "Accepted requests without a "
                                     "first token yet (bounded by max_queued_requests)", registry=r)
        self.queued_tokens = Gauge("ascendra_queued_tokens", "Their prompt tokens (bounded by "
                                   "max_queued_tokens)", registry=r)
        self.prefix_cache = PrefixCacheMetrics(r)
        self.tensor_parallel = Gauge("ascendra_instance_tp", "Tensor-parallel degree of an "
                                     "instance (its ranks, one process each), and the GPU ids "
                                     "it runs on (\"\": CPU or unpinned)", ["instance", "devices"],
                                     registry=r)
        # `<n>A` layouts: roles change online (docs/design.md §5.10)
        self.role_changes = Counter("ascendra_role_changes", "Instances that changed role, "
                                    "by old and new role", ["from", "to"], registry=r)
        # ESP groups (daemon/core/esp_groups.py): formed, and dissolved by why
        self.esp_groups = Counter("ascendra_esp_groups", "ESP groups formed and dissolved "
                                  "(event), of how many instances (degree)",
                                  ["event", "degree"], registry=r)

    def watch_roles(self, seconds: Callable[[], Mapping[tuple[int, Role], float]]) -> None:
        """`ascendra_instance_role_seconds{instance,role}`, read from `seconds` at every
        scrape (`<n>A` layouts)."""
        self.registry.register(_RoleSeconds(seconds))

    def watch_gateway(self, model_name: str, view: Callable[[], GatewayView]) -> None:
        """Expose the model-server protocol's gauges (vllm:*), read from `view` per scrape."""
        self.registry.register(GatewayCollector(model_name, view))

    # ---- observers ---------------------------------------------------------------------
    def observe(self, action) -> None:
        """Count what one controller-core action says happened."""
        match action:
            case Tokens():
                self.observe_tokens(action)
            case Settle(outcome=outcome, code=code, instance=instance, e2e=e2e):
                self.requests.labels(outcome.value).inc()
                self.tenants.settled(action)
                self.prefix_cache.settled(action)
                if e2e is not None:
                    self.e2e.observe(e2e)
                if outcome is Outcome.DROPPED:
                    self.dropped.labels(code.value).inc()
                elif outcome is Outcome.COMPLETED and instance is not None:
                    role = self.roles.get(instance)
                    self.served.labels(str(instance), role.value if role else "?").inc()
            case Refuse(refusal=refusal):
                self.dropped.labels(refusal.value).inc()
            case Moved(kind=kind):
                if kind in (Origin.OFFLOAD, Origin.RESCUE):
                    self.offloads.inc()
                else:
                    self.recovered.labels(kind.value).inc()
            case TicketOpened():
                self.tickets.inc()
            case RoleSwitched(instance_id=instance, old=old, new=new):
                self.roles[instance] = new
                self.role_changes.labels(old.value, new.value).inc()
            case EspChanged(members=members, formed=formed):
                self.esp_groups.labels("formed" if formed else "dissolved",
                                       str(len(members))).inc()

    def observe_tokens(self, action: Tokens) -> None:
        """Count a step's tokens: one counter step, one pass over each histogram."""
        self.output_tokens.inc(len(action.tokens))
        if action.ttfts:
            self.ttft.observe_many(list(action.ttfts.values()))
        if action.tbts:
            self.tbt.observe_many(action.tbts)

    def heartbeat(self, beat: Heartbeat) -> None:
        name = str(beat.instance_id)
        self.waiting.labels(name).set(beat.num_waiting)
        self.running.labels(name).set(beat.num_running)
        self.kv_usage.labels(name).set(beat.num_kv_blocks_used / max(beat.num_kv_blocks, 1))
        self.preemptions.labels(name).set(beat.num_preemptions)
        for model, blocks in beat.kv_blocks_by_model.items():
            self.model_kv_blocks.labels(name, model).set(blocks)
        self.prefix_cache.heartbeat(beat)
        if beat.perf_model_mape is not None:
            self.perf_model_mape.labels(name).set(beat.perf_model_mape)

    def ready(self, ready: Ready) -> None:
        devices = ",".join(map(str, ready.devices))
        self.tensor_parallel.labels(str(ready.instance_id), devices).set(ready.tp)

    def instance_down(self, instance_id: int) -> None:
        name = str(instance_id)
        self.restarts.labels(name).inc()
        for gauge in (self.waiting, self.running, self.kv_usage):
            gauge.labels(name).set(0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _RoleSeconds(Collector):
    """Seconds each instance has served in each role, as the controller core counts them."""

    def __init__(self, seconds: Callable[[], Mapping[tuple[int, Role], float]]) -> None:
        self.seconds = seconds

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("ascendra_instance_role_seconds", "Seconds the instance "
                                   "has served in each role", labels=["instance", "role"])
        for (instance, role), seconds in sorted(self.seconds().items()):
            family.add_metric([str(instance), role.value], round(seconds, 3))
        yield family
