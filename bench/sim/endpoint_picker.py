"""Which box a gateway sends a request to, pure: the Gateway API Inference Extension's
endpoint picker (EPP), modelled on the plain numbers it scrapes from each model server.

What it follows (gateway-api-inference-extension, `pkg/epp` as of mid-2026, the same in
llm-d-inference-scheduler, where the EPP now lives):

* the **default scheduling profile** (`config/loader/defaults.go`) scores every endpoint
  with the `queue-scorer` (weight 2), the `kv-cache-utilization-scorer` (weight 2) and
  the `prefix-cache-scorer` (weight 3), adds the weighted scores (each clamped to
  [0, 1]; the sum is not divided by the total weight) and lets the `max-score-picker`
  take the highest, ties broken at random;
* **queue scorer** (`scorer/queuedepth`): min-max normalised over the candidates,
  `(max_waiting - waiting) / (max_waiting - min_waiting)`, 1 for every endpoint when all
  queues are equal;
* **KV scorer** (`scorer/kvcacheutilization`): `1 - kv_cache_usage` of each endpoint;
* the **prefix scorer** is left out: it scores the share of a prompt's blocks an
  endpoint has cached, and the simulated prompts carry no shared prefixes, so it would
  add the same 0 to every box and change no pick;
* the views are **scraped** every `refresh-metrics-interval` (default 50 ms), so they are
  up to one interval old; the scraping is the driver's (bench/sim/fleet.py), not this file's;
* **admission** is left out: with flow control off (its feature gate's default) the EPP
  turns away only sheddable requests (priority < 0) while every endpoint is saturated
  (`requestcontrol/admission.go`, the legacy admission controller), and the simulated
  requests are not sheddable.

The other pickers, for comparison: `least_queue` -- the queue scorer alone (the fewest
waiting requests, ties at random), which is also what the EPP's pre-plugin default
(v0.3: a least-queuing, then least-KV filter chain and a random pick) reduces to when
queues differ -- and `round_robin`, which reads no metrics at all.

Randomness is the caller's: a tie is broken by `tie_break` in [0, 1) (the driver draws
it from a seeded generator), so the same inputs pick the same box.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

import msgspec


class EndpointMetrics(Protocol):
    """The three protocol metrics the EPP reads from one model server."""

    num_requests_waiting: int       # vllm:num_requests_waiting
    num_requests_running: int       # vllm:num_requests_running
    kv_cache_usage_perc: float      # vllm:kv_cache_usage_perc, a share in [0, 1]


class Picker(str, enum.Enum):
    EPP = "epp"                     # the default profile's queue + KV scorers, max score
    LEAST_QUEUE = "least_queue"     # the queue scorer alone
    ROUND_ROBIN = "round_robin"     # in turn, metrics unread


class EppWeights(msgspec.Struct, frozen=True, kw_only=True):
    """The default profile's scorer weights (the prefix scorer's 3 adds 0 here)."""
    queue: float = 2.0
    kv_cache: float = 2.0


def queue_scores(views: Sequence[EndpointMetrics]) -> list[float]:
    """The queue scorer: the shortest queue 1, the longest 0, linear between."""
    waiting = [v.num_requests_waiting for v in views]
    low, high = min(waiting), max(waiting)
    if high == low:
        return [1.0] * len(views)
    return [(high - w) / (high - low) for w in waiting]


def kv_cache_scores(views: Sequence[EndpointMetrics]) -> list[float]:
    """The KV-cache utilisation scorer: the free share of each endpoint's KV cache."""
    return [1.0 - v.kv_cache_usage_perc for v in views]


def epp_scores(views: Sequence[EndpointMetrics], weights: EppWeights = EppWeights()) -> list[float]:
    """Each endpoint's weighted score, as the default profile adds them up."""
    return [weights.queue * _clamp(q) + weights.kv_cache * _clamp(k)
            for q, k in zip(queue_scores(views), kv_cache_scores(views))]


def max_score(scores: Sequence[float], tie_break: float) -> int:
    """The max-score picker: the best endpoint; among equals, the one `tie_break` names."""
    best = max(scores)
    tied = [i for i, s in enumerate(scores) if s == best]
    return tied[min(int(tie_break * len(tied)), len(tied) - 1)]


def pick_endpoint(picker: Picker, views: Sequence[EndpointMetrics], *, turn: int,
                  tie_break: float, weights: EppWeights = EppWeights()) -> int:
    """The index in `views` of the endpoint `picker` sends the next request to. `turn`
    counts the requests picked so far (round-robin's cursor); `tie_break` is in [0, 1)."""
    if not views:
        raise ValueError("pick_endpoint: no endpoints to pick from")
    if not 0.0 <= tie_break < 1.0:
        raise ValueError(f"pick_endpoint: tie_break must be in [0, 1), got {tie_break}")
    match Picker(picker):
        case Picker.EPP:
            return max_score(epp_scores(views, weights), tie_break)
        case Picker.LEAST_QUEUE:
            return max_score(queue_scores(views), tie_break)
        case Picker.ROUND_ROBIN:
            return turn % len(views)
        case other:
            raise ValueError(f"pick_endpoint: unknown picker {other!r}")


def _clamp(score: float) -> float:
    return min(1.0, max(0.0, score))
