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
arrival rate counts every request. With a fair floor F (`fair_floor`, and each
request's class in `classes`) the costliest are refused only while their class keeps at
least F of its requests: the fair ceiling, the bound for a point that must hold fairly
(bench/records/request_classes.py).
"""
from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from bench.ruler.ruler import RulerConfig, ruler_classes, workload_requests
from engines.executors.profiles.registry import get_profile
from policies.batch_shape import BatchShape

#: Token budgets the model tries (every power of two from 64 to 16,384, and midpoints).
BUDGETS = tuple(sorted({int(b) for b in np.geomspace(64, 16384, 17)}))


def ceiling_qps(profile, lengths: Sequence[tuple[int, int]], num_instances: int,
                tbt_slo: float, kv_tokens: int | None = None, served_share: float = 1.0,
                fair_floor: float = 0.0, classes: Sequence[int] | None = None) -> float:
    """Requests/s `num_instances` instances of `profile` can sustain on requests of these
    (prompt, output) lengths with each step within `tbt_slo` seconds, serving the
    cheapest `served_share` of them -- and at least `fair_floor` of each class of
    `classes` (one class index per request)."""
    if not lengths:
        raise ValueError("a ceiling needs at least one request")
    if not 0 < served_share <= 1:
        raise ValueError(f"served_share must be in (0, 1], got {served_share}")
    prompts, outputs = np.asarray(lengths, dtype=float).T
    kept_share = 1.0
    if served_share < 1:
        keep = _cheapest(profile, prompts, outputs, served_share, fair_floor,
                         np.zeros(len(prompts), dtype=int) if classes is None
                         else np.asarray(classes))
        kept_share = len(keep) / len(prompts)  # above served_share if a floor stopped it
        prompts, outputs = prompts[keep], outputs[keep]
    return _fluid_qps(profile, prompts, outputs, tbt_slo, kv_tokens) * num_instances / kept_share


def _cheapest(profile, prompts: np.ndarray, outputs: np.ndarray, share: float,
              fair_floor: float, classes: np.ndarray) -> np.ndarray:
    """Indices of the requests kept when the costliest (by GPU time) are refused, up to
    `1 - share` of them, each only while its class keeps `fair_floor` of its own."""
    per_prefill = profile.step_time(BatchShape.prefill_only(2048)) / 2048
    context = int(prompts.mean() + outputs.mean() / 2)
    per_decode = profile.step_time(BatchShape.of(decodes=[context] * 128)) / 128
    cost = prompts * per_prefill + outputs * per_decode
    to_refuse = len(cost) - max(1, round(share * len(cost)))
    labels, sizes = np.unique(classes, return_counts=True)
    may_refuse = dict(zip(labels.tolist(), np.floor(sizes * (1 - fair_floor) + 1e-9).tolist()))
    refused = np.zeros(len(cost), dtype=bool)
    for i in np.argsort(-cost, kind="stable"):
        if to_refuse == 0:
            break
        if may_refuse[classes[i]] >= 1:
            may_refuse[classes[i]] -= 1
            refused[i] = True
            to_refuse -= 1
    return np.flatnonzero(~refused)


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


class Ceilings(msgspec.Struct, frozen=True):
    """A workload's ceilings on N GPUs, requests/s."""
    all_served_qps: float      # every request served, each step within the TBT target
    cheapest_qps: float        # the cheapest `target` % served (the bound for that target)
    fair_qps: float            # ... with every prompt-length class at the fair floor


def workload_ceilings(config: RulerConfig, num_instances: int = 3) -> Ceilings:
    """The ceilings of the ruler's workload (its first seed's requests), under the TBT
    target of its loosest SLO class (a bound: no class can do better)."""
    lengths = [(r.prompt_len, r.output_len)
               for r in workload_requests(config, 1.0, config.seeds[0])]
    classes = {s.slo_class for s in config.workload.slo_mix or () if s.share > 0}
    tbt = max([config.slo.tbt_slo, *(c.tbt_slo for c in config.workload.slo_classes
                                      if c.name in classes)])
    profile = get_profile(config.profile)
    share = config.target / 100
    prompt_classes = ruler_classes(config).prompt_classes([p for p, _ in lengths])
    return Ceilings(
        round(ceiling_qps(profile, lengths, num_instances, tbt), 3),
        round(ceiling_qps(profile, lengths, num_instances, tbt, served_share=share), 3),
        round(ceiling_qps(profile, lengths, num_instances, tbt, served_share=share,
                          fair_floor=config.fair_floor, classes=prompt_classes), 3))
