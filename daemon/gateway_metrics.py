"""The model-server protocol's Prometheus gauges, under the names a gateway scrapes.

The Gateway API Inference Extension's endpoint picker (llm-d's router) reads vLLM's
names by default -- `vllm:num_requests_waiting`, `vllm:num_requests_running`,
`vllm:kv_cache_usage_perc`, and `vllm:cache_config_info` for its prefix-cache scorer --
so Ascendra exposes its box-wide values under them, beside its own `ascendra_*`
metrics. One `GatewayView` (daemon/gateway_view.py) is taken per scrape, so the gauges
of one scrape agree with each other. docs/gateway_protocol.md says what each one means.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from daemon.gateway_view import GatewayView

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
CACHE_CONFIG = "vllm:cache_config_info"
#: The label vLLM puts on every series (the gateway does not filter on it).
MODEL_LABEL = "model_name"
#: (name, help, GatewayView field) of each load gauge.
GAUGES = (
    (WAITING, "Requests the box has accepted that are not in a running batch",
     "num_requests_waiting"),
    (RUNNING, "Requests in a running batch of the box's instances", "num_requests_running"),
    (KV_USAGE, "Share of the box's KV-cache blocks in use (1 = 100 percent)",
     "kv_cache_usage_perc"),
)


class GatewayCollector(Collector):
    def __init__(self, model_name: str, view: Callable[[], GatewayView]) -> None:
        self.model_name = model_name
        self.view = view

    def describe(self) -> list[GaugeMetricFamily]:
        return list(self._families(None))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        return self._families(self.view())

    def _families(self, view: GatewayView | None) -> Iterator[GaugeMetricFamily]:
        labels = [self.model_name]
        for name, doc, field in GAUGES:
            family = GaugeMetricFamily(name, doc, labels=[MODEL_LABEL])
            if view is not None:
                family.add_metric(labels, getattr(view, field))
            yield family
        info = GaugeMetricFamily(CACHE_CONFIG, "KV-cache layout of the box (value 1; the "
                                 "labels say it)", labels=[MODEL_LABEL, "block_size",
                                                           "num_gpu_blocks"])
        if view is not None and view.block_size:  # no instance ready: no layout to state
            info.add_metric([*labels, str(view.block_size), str(view.num_gpu_blocks)], 1)
        yield info
