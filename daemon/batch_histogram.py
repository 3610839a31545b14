"""A Prometheus histogram observed a batch of values at a time.

prometheus_client's `Histogram.observe` takes one value per call (about 1 us each, with a
lock); the controller has a value per streamed token (TTFT, TBT), tens of thousands a
second. This collector keeps the same counts with a bisect per value and is exposed
through prometheus_client's public collector API (`HistogramMetricFamily`), with the
very samples a `Histogram` of the same name and buckets has: `_bucket{le}` (cumulative,
`+Inf` last), `_count`, `_sum` and `_created`.
"""
from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


class BatchHistogram(Collector):
    def __init__(self, name: str, documentation: str, buckets: Iterable[float],
                 registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = sorted(float(b) for b in buckets)
        if not self.bounds or self.bounds[-1] != math.inf:
            self.bounds.append(math.inf)
        self.counts = [0] * len(self.bounds)  # per bucket, not cumulative
        self.sum = 0.0
        self.created = time.time()
        registry.register(self)

    def observe_many(self, values: list[float]) -> None:
        """Count every one of `values` (seconds), as `observe` on each would."""
        bounds, counts = self.bounds, self.counts
        for value in values:
            counts[bisect.bisect_left(bounds, value)] += 1  # first bound >= value: `le`
        self.sum += sum(values)

    def observe(self, value: float) -> None:
        self.observe_many([value])

    def describe(self):
        return [HistogramMetricFamily(self.name, self.documentation)]

    def collect(self):
        family = HistogramMetricFamily(self.name, self.documentation)
        cumulative, buckets = 0, []
        for bound, count in zip(self.bounds, self.counts):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        family.add_metric([], buckets, self.sum)
        family.add_sample(self.name + "_created", {}, self.created)
        yield family
