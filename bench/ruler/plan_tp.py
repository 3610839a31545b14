"""`plan` over tensor-parallel degrees: N GPUs as N/k instances of k GPUs each, for every
degree k the profile fits at, each degree's role layouts and baselines searched as `plan`
searches them; the recommendation is the best (fair capacity, then capacity) over all.

Why a degree wins is stated with the answer: fewer, faster instances (a larger k) prefill a
long prompt sooner and hold more KV per instance; more instances (a smaller k) give the
roles and the router room and pay no all-reduces.
"""
from __future__ import annotations

from collections.abc import Callable

import msgspec

from bench.ruler.plan import PlanAnswer, plan
from bench.ruler.ruler import RulerConfig
from engines.executors.profiles.registry import TP_DEGREES, get_profile, with_tp


class DegreePlan(msgspec.Struct, kw_only=True):
    tp: int
    instances: int
    answer: PlanAnswer | None = None
    #: why the degree was not simulated ("" when it was)
    skipped: str = ""


class TpPlanAnswer(msgspec.Struct, kw_only=True):
    num_gpus: int
    degrees: list[DegreePlan]
    recommended_tp: int
    recommended: str
    why: str


def fitting_degrees(profile: str, num_gpus: int) -> list[tuple[int, str]]:
    """(degree, why not) for each measured degree dividing `num_gpus`; why = "" if it fits."""
    out = []
    for k in TP_DEGREES:
        if k > num_gpus or num_gpus % k:
            continue
        try:
            get_profile(with_tp(profile, k)).kv_capacity_tokens
            out.append((k, ""))
        except ValueError as exc:
            out.append((k, str(exc)))
    return out


def plan_degrees(config: RulerConfig, num_gpus: int, workers: int | None = None,
                 progress: Callable[[str], None] | None = None) -> TpPlanAnswer:
    degrees = []
    for k, why_not in fitting_degrees(config.profile, num_gpus):
        if why_not:
            degrees.append(DegreePlan(tp=k, instances=num_gpus // k, skipped=why_not))
            continue
        if progress:
            progress(f"plan: tp {k}: {num_gpus // k} instances of {k} GPUs")
        at_k = msgspec.structs.replace(config, profile=with_tp(config.profile, k))
        try:
            answer = plan(at_k, num_gpus // k, workers, progress)
        except ValueError as exc:  # e.g. a ceiling of 0: not one running batch fits its KV
            degrees.append(DegreePlan(tp=k, instances=num_gpus // k, skipped=str(exc)))
            continue
        degrees.append(DegreePlan(tp=k, instances=num_gpus // k, answer=answer))
    ran = [d for d in degrees if d.answer is not None]
    if not ran:
        raise ValueError(f"tp: {config.profile} fits no degree dividing {num_gpus} GPUs: "
                         + "; ".join(f"tp {d.tp}: {d.skipped}" for d in degrees))
    best, layout = max(((d, c) for d in ran for c in d.answer.candidates),
                        key=lambda dc: (dc[1].fair_capacity_qps, dc[1].capacity_qps))
    return TpPlanAnswer(num_gpus=num_gpus, degrees=degrees, recommended_tp=best.tp,
                        recommended=layout.layout, why=_why(best, ran))


def _why(best: DegreePlan, ran: list[DegreePlan]) -> str:
    others = [d for d in ran if d is not best]
    if not others:
        return f"tp {best.tp} is the only degree that fits"
    top = {d.tp: max(c.fair_capacity_qps for c in d.answer.candidates) for d in ran}
    rest = ", ".join(f"tp {k}: {q:.2f}" for k, q in sorted(top.items()) if k != best.tp)
    reason = ("fewer, faster instances: each prefills a long prompt sooner and holds more KV"
              if best.tp > min(top) else
              "more instances: the roles and the router have room, and no all-reduces are paid")
    return f"best fair capacity {top[best.tp]:.2f} QPS at tp {best.tp} ({rest}): {reason}"
