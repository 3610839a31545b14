"""Prometheus metrics of prefix caching (part of `daemon.metrics.Metrics`' registry).

Two views of the hit rate:

* per request, from the controller core's `Settle` of each completed request:
  `ascendra_prompt_tokens_total` and `ascendra_prompt_tokens_cached_total` (the prompt
  tokens its instance found cached at its first admission, as the API's
  `usage.prompt_tokens_details.cached_tokens` reports them);
* per instance, from its heartbeats (every admission's lookup, a recompute after
  preemption included): `ascendra_instance_prefix_cache_queries{instance,unit}` and
  `..._hits{instance,unit}` in blocks and tokens since the instance started, and their
  ratio `ascendra_instance_prefix_cache_hit_rate{instance,unit}`.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from daemon.core.events import Settle
from daemon.core.request_state import Outcome
from ipc.messages import Heartbeat


class PrefixCacheMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.prompt_tokens = Counter("ascendra_prompt_tokens", "Prompt tokens of completed "
                                     "requests", registry=r)
        self.cached_tokens = Counter("ascendra_prompt_tokens_cached", "... of them found in "
                                     "their instance's prefix cache", registry=r)
        self.queries = Gauge("ascendra_instance_prefix_cache_queries", "Prefix-cache lookups "
                             "at admission since the instance started, in blocks and tokens",
                             ["instance", "unit"], registry=r)
        self.hits = Gauge("ascendra_instance_prefix_cache_hits", "... and what they found "
                          "cached", ["instance", "unit"], registry=r)
        self.hit_rate = Gauge("ascendra_instance_prefix_cache_hit_rate", "Hits over queries "
                              "(0..1)", ["instance", "unit"], registry=r)

    def settled(self, settle: Settle) -> None:
        if settle.outcome is Outcome.COMPLETED:
            self.prompt_tokens.inc(settle.prompt_tokens)
            self.cached_tokens.inc(settle.cached_tokens)

    def heartbeat(self, beat: Heartbeat) -> None:
        name = str(beat.instance_id)
        for unit, queried, hit in (
                ("blocks", beat.prefix_queried_blocks, beat.prefix_hit_blocks),
                ("tokens", beat.prefix_queried_tokens, beat.prefix_hit_tokens)):
            self.queries.labels(name, unit).set(queried)
            self.hits.labels(name, unit).set(hit)
            self.hit_rate.labels(name, unit).set(hit / queried if queried else 0.0)
