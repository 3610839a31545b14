"""`ascendra plan`: which layout of N GPUs serves a workload best, by simulation.

Every candidate split of the GPUs -- all LP (`NL0H`), each `kLmH`, each prefill/decode
split `kPmD` (DistServe's placement idea: the P:D ratio that holds the most goodput for
this workload and these SLOs), and the baselines `Nxsarathi`, `Nxvllm-v0`, `Nxvllm-v1` and
`Nxsglang` -- gets its steady-state capacity on the ruler (bench/ruler/ruler.py:
same workload, SLOs, routing, warm-up rule) with one seed, searched from the hardware
ceiling; the recommendation is the highest fair capacity (every request class at the
ruler's class floor: no class pays for the capacity; ties go to the higher capacity),
printed with every candidate's capacity and fair capacity beside the ceilings so the gap
to the best possible is plain. A candidate whose number is 0 says why (`note`): no rate
tried held the target, down to the lowest tried.

`--quick` (`QUICK_STEPS`) is a first look within about two minutes of two cores: fewer
measured requests, searches in steps of 2x to a 20 % tolerance and at most 6 (capacity)
and 4 (fair capacity) rates per layout, and a point judged on its measured goodput alone:
the ruler's check of 4 windows within 3 points of the target is noise at 100 requests a
window (on very bursty traffic it failed 3A at 1.5 QPS for one window at 79 % when the
run held 91.8 %). Its answer says it is no steady state.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import msgspec

from bench.parallel import imap_unordered
from bench.ruler.ceiling import workload_ceilings
from bench.ruler.ruler import RulerConfig, SearchSteps, SeedCapacity, Subject, seed_capacity
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
    #: Why a capacity or fair capacity is 0, e.g. "holds 90 % at no rate tried (down to
    #: 0.16 QPS)"; "" when both are found.
    note: str = ""


#: `plan --quick`'s searches: from the start rate in steps of 2x, to a 20 % tolerance, at
#: most 6 rates for the capacity and 4 for the fair capacity (the capacity's is reused).
QUICK_STEPS = SearchSteps(max_runs=6, fair_growth=2.0, fair_max_runs=4)
QUICK_GROWTH = 2.0
QUICK_TOLERANCE = 0.2


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
         progress: Callable[[str], None] | None = None, quick: bool = False,
         layout_done: Callable[[str], None] | None = None) -> PlanAnswer:
    """`progress` takes the lines said before the search; `layout_done` a line as each
    layout's search ends (default: `progress`). `quick`: `QUICK_STEPS` searches."""
    layouts = candidate_layouts(num_gpus)
    layout_done = layout_done or progress
    if quick:
        config = msgspec.structs.replace(config, tolerance=QUICK_TOLERANCE,
                                         rule=msgspec.structs.replace(config.rule, windows=1))
    if progress:
        progress(f"plan: {len(layouts)} layouts of {num_gpus} GPUs ({', '.join(layouts)}), "
                 f"{config.measured} measured requests per point; computing the hardware "
                 "ceiling ...")
    ceiling = workload_ceilings(config, num_gpus)
    if progress:
        progress(f"plan: ceiling {ceiling.all_served_qps:.2f} QPS (all served); simulating "
                 "each layout (a search of several runs each; a line as each finishes) ...")
    growth, steps = (QUICK_GROWTH, QUICK_STEPS) if quick else (None, SearchSteps())
    jobs = [(Subject(label=layout, layout=layout), config, config.seeds[0],
             0.8 * ceiling.all_served_qps, growth, steps)
            for layout in layouts]
    results: dict[str, SeedCapacity] = {}
    started = time.perf_counter()
    for index, result in imap_unordered(_job, jobs, workers):
        layout = layouts[index]
        results[layout] = result
        if layout_done:
            layout_done(f"  [{len(results)}/{len(layouts)}] {layout:>10}: "
                        f"{result.capacity_qps:.2f} QPS, fair {result.fair_capacity_qps:.2f} "
                        f"({len(result.points)} rates; {time.perf_counter() - started:.0f} s "
                        "into the search)")
    short = too_short(config.measured)
    candidates = []
    for layout in layouts:
        r = results[layout]
        warnings = [w for w in (
            above_bound(r.capacity_qps, ceiling.cheapest_qps,
                        f"bound for {config.target:g} % goodput"),
            above_bound(r.fair_capacity_qps, ceiling.fair_qps, "fair ceiling")) if w]
        candidates.append(Candidate(
            layout=layout, capacity_qps=r.capacity_qps, fair_capacity_qps=r.fair_capacity_qps,
            fraction_of_ceiling=round(r.capacity_qps / ceiling.all_served_qps, 3),
            steady_state=not warnings and short is None, warnings=warnings,
            note=zero_note(r, config.target, config.fair_floor)))
    best = max(candidates, key=lambda c: (c.fair_capacity_qps, c.capacity_qps))
    return PlanAnswer(num_gpus=num_gpus, config=config, ceiling_qps=ceiling.all_served_qps,
                      ceiling_target_qps=ceiling.cheapest_qps, fair_ceiling_qps=ceiling.fair_qps,
                      candidates=candidates, recommended=best.layout,
                      steady_state=all(c.steady_state for c in candidates))


def zero_note(result: SeedCapacity, target: float, fair_floor: float) -> str:
    """Why a capacity (or fair capacity) is 0: no rate tried held, down to the lowest."""
    lowest = min((p.qps for p in result.points), default=0.0)
    if result.capacity_qps == 0:
        return f"holds {target:g} % at no rate tried (down to {lowest:.2f} QPS)"
    if result.fair_capacity_qps == 0:
        return (f"no rate tried holds every class at {100 * fair_floor:g} % (down to "
                f"{lowest:.2f} QPS)")
    return ""


def _job(job) -> SeedCapacity:
    subject, config, seed, start, growth, steps = job
    if growth is None:
        return seed_capacity(subject, config, seed, start, steps=steps)
    return seed_capacity(subject, config, seed, start, growth, steps)
