"""`ascendra plan --model-mix A=0.8,B=0.2`: which placement of N GPUs serves a mix of
models best -- dedicated GPUs per model (every split, as Sarathi peers or with LP/HP
roles), every GPU multiplexing every model (engines/mux_core.py, likewise), or vLLM V1
dedicated by popularity -- by each placement's capacity under the mix
(bench/ruler/model_mix.py: the highest total rate at which every model holds 90 %
goodput, a reduced protocol). The recommendation is the highest capacity; a tie goes to
the dedicated placement (no model's requests wait on another's step).
"""
from __future__ import annotations

from collections.abc import Callable

import msgspec

from bench.parallel import imap_unordered
from bench.ruler.model_mix import PROTOCOL, MixRun, Placement, candidate_placements, capacity

#: Capacity searches of `plan --model-mix`: to 10 %, at most 6 rates a placement.
TOLERANCE = 0.1
MAX_RUNS = 6


class MixCandidate(msgspec.Struct, kw_only=True):
    placement: str
    multiplexed: bool
    capacity_qps: float
    #: each model's goodput %, p99 TTFT and mean TBT at that capacity
    at_capacity: dict[str, dict] | None = None


class MixPlanAnswer(msgspec.Struct, kw_only=True):
    num_gpus: int
    mix: dict[str, float]
    profiles: dict[str, str]
    protocol: str
    candidates: list[MixCandidate]
    recommended: str


def _search(job: tuple[Placement, MixRun]) -> dict:
    placement, run = job
    return capacity(placement, run, tolerance=TOLERANCE, max_runs=MAX_RUNS)


def plan_mix(num_gpus: int, run: MixRun, roles: bool = True, workers: int | None = None,
             progress: Callable[[str], None] | None = None) -> MixPlanAnswer:
    placements = candidate_placements(num_gpus, dict(run.mix), roles)
    rows: list[dict | None] = [None] * len(placements)
    for i, row in imap_unordered(_search, [(p, run) for p in placements], workers):
        rows[i] = row
        if progress:
            progress(f"[{sum(r is not None for r in rows)}/{len(rows)}] "
                     f"{row['placement']}: {row['capacity_qps']:.2f} QPS")
    candidates = [MixCandidate(placement=r["placement"], multiplexed=r["multiplexed"],
                               capacity_qps=r["capacity_qps"], at_capacity=r["at_capacity"])
                  for r in rows]
    best = max(candidates, key=lambda c: (c.capacity_qps, not c.multiplexed))
    return MixPlanAnswer(num_gpus=num_gpus, mix=dict(run.mix), profiles=dict(run.profiles),
                         protocol=PROTOCOL.format(n=run.num_requests, tol=100 * TOLERANCE),
                         candidates=candidates, recommended=best.placement)
