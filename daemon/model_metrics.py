"""`GET /metrics` of a daemon serving several models: each model's series, labelled `model`.

Every model's controller keeps its own Prometheus registry (daemon/metrics.py). With one
model `/metrics` is that registry as before; with several, the families of the same name
are merged into one and each series gains a `model` label naming its served model
(`ascendra_requests_total{model="b",outcome="completed"}`). The gateway gauges (`vllm:*`)
already name it in `model_name`, and keep just that.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from daemon.gateway_metrics import MODEL_LABEL

LABEL = "model"


class ModelsCollector(Collector):
    """The series of several registries, one per model name, merged family by family."""

    def __init__(self, registries: Mapping[str, Collector]) -> None:
        self.registries = dict(registries)

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for model, registry in self.registries.items():
            for family in registry.collect():
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation,
                                                        family.type, family.unit)
                into.samples.extend(sample if MODEL_LABEL in sample.labels else
                                    sample._replace(labels={LABEL: model, **sample.labels})
                                    for sample in family.samples)
        return iter(merged.values())


def render_metrics(registries: Mapping[str, Collector]) -> bytes:
    """Prometheus text of one model's registry, or of several labelled by model."""
    if len(registries) == 1:
        [registry] = registries.values()
        return generate_latest(registry)
    return generate_latest(ModelsCollector(registries))
