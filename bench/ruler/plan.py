"""`ascendra plan`: which layout of N GPUs serves a workload best, by simulation.

Every candidate split of the GPUs -- all LP (`NL0H`), each `kLmH`, each prefill/decode
split `kPmD` (DistServe's placement idea: the P:D ratio that holds the most goodput for
this workload and these SLOs), and the baselines `Nxsarathi`, `Nxvllm-v0`, `Nxvllm-v1` and
`Nxsglang` -- gets its steady-state capacity on the ruler (bench/ruler/ruler.py:
same workload, SLOs, routing, warm-up rule) with one seed, searched from the hardware
ceiling; the recommendation is the highest fair capacity (every request class at the
ruler's class floor: no class pays for the capacity; ties go to the higher capacity),
printed with every candidate's capacity and fair capacity beside the ceilings so the gap
to the best possible is plain.
"""
from __future__ import annotations

from collections.abc import Callable

import msgspec

from bench.parallel import imap
from bench.ruler.ceiling import workload_ceilings
from bench.ruler.ruler import RulerConfig, SeedCapacity, Subject, seed_capacity
from bench.ruler.short_run import above_bound, too_short
from engines.modes import BASELINES as BASELINE_MODES


class Candidate(msgspec.Struct, kw_only=True):
    layout: str
    capacity_qps: float
    fair_capacity_qps: float
    fraction_of_ceiling: float
    #: False when the run was too short or the capacity passes a hard bound (`warnings`).
    steady_state: bool = True
    warnings: list[str] = []


class PlanAnswer(msgspec.Struct, kw_only=True):
    num_gpus: int
    config: RulerConfig
    ceiling_qps: float
    ceiling_target_qps: float
    fair_ceiling_qps: float
    candidates: list[Candidate]
    recommended: str
    #: False when any candidate's number is not a steady state (bench/ruler/short_run.py).
    steady_state: bool = True


def candidate_layouts(num_gpus: int) -> list[str]:
    if num_gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {num_gpus}")
    splits = [f"{lp}L{num_gpus - lp}H" for lp in range(num_gpus, 0, -1)]
    online = [f"{num_gpus}A"] if num_gpus > 1 else []  # roles chosen online (one: an LP)
    disaggregated = [f"{p}P{num_gpus - p}D" for p in range(num_gpus - 1, 0, -1)]
    return splits + online + disaggregated + [f"{num_gpus}x{mode}" for mode in BASELINE_MODES]


def plan(config: RulerConfig, num_gpus: int, workers: int | None = None,
         progress: Callable[[str], None] | None = None) -> PlanAnswer:
    layouts = candidate_layouts(num_gpus)
    if progress:
        progress(f"plan: {len(layouts)} layouts of {num_gpus} GPUs ({', '.join(layouts)}), "
                 f"{config.measured} measured requests per point; computing the hardware "
                 "ceiling ...")
    ceiling = workload_ceilings(config, num_gpus)
    if progress:
        progress(f"plan: ceiling {ceiling.all_served_qps:.2f} QPS (all served); simulating "
                 "each layout (a search of several runs each; results as they finish) ...")
    jobs = [(Subject(label=layout, layout=layout), config, config.seeds[0],
             0.8 * ceiling.all_served_qps)
            for layout in layouts]
    results: list[SeedCapacity] = []
    for done, (layout, result) in enumerate(zip(layouts, imap(_job, jobs, workers)), 1):
        results.append(result)
        if progress:
            progress(f"  [{done}/{len(layouts)}] {layout:>10}: {result.capacity_qps:.2f} QPS, "
                     f"fair {result.fair_capacity_qps:.2f}")
    short = too_short(config.measured)
    candidates = []
    for layout, r in zip(layouts, results):
        warnings = [w for w in (
            above_bound(r.capacity_qps, ceiling.cheapest_qps,
                        f"bound for {config.target:g} % goodput"),
            above_bound(r.fair_capacity_qps, ceiling.fair_qps, "fair ceiling")) if w]
        candidates.append(Candidate(
            layout=layout, capacity_qps=r.capacity_qps, fair_capacity_qps=r.fair_capacity_qps,
            fraction_of_ceiling=round(r.capacity_qps / ceiling.all_served_qps, 3),
            steady_state=not warnings and short is None, warnings=warnings))
    best = max(candidates, key=lambda c: (c.fair_capacity_qps, c.capacity_qps))
    return PlanAnswer(num_gpus=num_gpus, config=config, ceiling_qps=ceiling.all_served_qps,
                      ceiling_target_qps=ceiling.cheapest_qps, fair_ceiling_qps=ceiling.fair_qps,
                      candidates=candidates, recommended=best.layout,
                      steady_state=all(c.steady_state for c in candidates))


def _job(job) -> SeedCapacity:
    subject, config, seed, start = job
    return seed_capacity(subject, config, seed, start)
