"""The hardware ceiling of a workload: the highest rate N instances could sustain with
perfect scheduling, from a GPU profile's step times. Every capacity is printed beside it,
so a result reads as a fraction of what is possible.

A fluid model of one instance in steady state. Each step runs C tokens: D decodes and
C - D prefill tokens. Served requests must bring as many prompt tokens as they take
output tokens, so D / (C - D) = O / P (mean output and prompt lengths), and the rate is

    qps(C) = D / (O * step(C))      with D = C * O / (P + O)

`step(C)` is the profile's time of one such step: one prefill chunk of C - D tokens at
the mean position within a prompt (P / 2 cached) and D decodes at the mean context
(P + O / 2). The ceiling is the best qps(C) over token budgets C whose step fits the
TBT target (goodput's mean TBT: a step longer than that fails every decode in it) and
whose D running requests fit the KV cache, times N. TTFT targets, queueing and
imperfect packing are ignored: no scheduler can do better, real ones do worse.

Capacity asks for goodput >= 90 %, not 100 %: a perfect scheduler may give up on the 10 %
of requests that cost most and serve the rest. `served_share` = 0.9 gives that ceiling:
the fluid rate of the cheapest 90 % (cost = prompt tokens x seconds per prefill token +
output tokens x seconds per decode, both from the profile), divided by 0.9 because the
arrival rate counts every request.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from policies.perf.batch_shape import BatchShape

#: Token budgets the model tries (every power of two from 64 to 16,384, and midpoints).
BUDGETS = tuple(sorted({int(b) for b in np.geomspace(64, 16384, 17)}))


def ceiling_qps(profile, lengths: Sequence[tuple[int, int]], num_instances: int,
                tbt_slo: float, kv_tokens: int | None = None, served_share: float = 1.0,
                ) -> float:
    """Requests/s `num_instances` instances of `profile` can sustain on requests of these
    (prompt, output) lengths with each step within `tbt_slo` seconds, serving the
    cheapest `served_share` of them."""
    if not lengths:
        raise ValueError("a ceiling needs at least one request")
    if not 0 < served_share <= 1:
        raise ValueError(f"served_share must be in (0, 1], got {served_share}")
    prompts, outputs = np.asarray(lengths, dtype=float).T
    if served_share < 1:
        keep = _cheapest(profile, prompts, outputs, served_share)
        prompts, outputs = prompts[keep], outputs[keep]
    return _fluid_qps(profile, prompts, outputs, tbt_slo, kv_tokens) * num_instances / served_share


def _cheapest(profile, prompts: np.ndarray, outputs: np.ndarray, share: float) -> np.ndarray:
    """Indices of the cheapest `share` of the requests by GPU time."""
    per_prefill = profile.step_time(BatchShape.prefill_only(2048)) / 2048
    context = int(prompts.mean() + outputs.mean() / 2)
    per_decode = profile.step_time(BatchShape.of(decodes=[context] * 128)) / 128
    cost = prompts * per_prefill + outputs * per_decode
    return np.argsort(cost, kind="stable")[:max(1, round(share * len(cost)))]


def _fluid_qps(profile, prompts: np.ndarray, outputs: np.ndarray, tbt_slo: float,
               kv_tokens: int | None) -> float:
    p, o = float(prompts.mean()), float(max(outputs.mean(), 1.0))
    kv = kv_tokens if kv_tokens is not None else profile.kv_capacity_tokens
    best = 0.0
    for budget in BUDGETS:
        decodes = max(1, round(budget * o / (p + o)))
        prefill = max(1, budget - decodes)
        context = int(p + o / 2)
        if decodes * context > kv:
            continue
        shape = BatchShape.of(prefills=[(prefill, int(p / 2))], decodes=[context] * decodes)
        seconds = profile.step_time(shape)
        if seconds <= tbt_slo:
            best = max(best, decodes / (o * seconds))
    return best
