"""The capacity table: every workload x layout on the ruler (bench/ruler.py), baselines at
their own best, beside the hardware ceiling.

Per workload, in two phases over a process pool:

1. **tune** the baselines on seed 0: Sarathi-Serve at each chunk size in `SARATHI_CHUNKS`,
   vLLM at each prefill token budget in `VLLM_BUDGETS`; the upstream defaults are among
   them (`UPSTREAM`) and reported as their own rows;
2. **measure** the best-tuned Sarathi and vLLM and Ascendra's layouts on every seed
   (seed 0 of the tuned baselines is reused), each seed searching from the ceiling.

A row's ratio is its mean capacity over the best tuned baseline's mean capacity.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

import msgspec

from bench.ceiling import ceiling_qps
from bench.ruler import (
    NEAR_GROWTH, START_GROWTH, RulerConfig, SeedCapacity, Subject, seed_capacity,
    workload_requests,
)
from engines.executors.profiles.registry import get_profile
from engines.scheduler_config import SchedulerConfig

SARATHI_CHUNKS = (512, 1024, 2048)
#: vLLM's prefill batches run whole prompts: its budget is at least the context limit.
VLLM_BUDGETS = (8192, 16384)
#: Upstream defaults: Sarathi-Serve's paper runs chunk 512 (strict SLOs) and vLLM's
#: max_num_batched_tokens defaults to max_model_len without chunked prefill.
UPSTREAM = {"3xsarathi": 512, "3xvllm": 8192}
ASCENDRA = ("2L1H", "1L2H")


class Row(msgspec.Struct, kw_only=True):
    label: str
    layout: str
    chunk_size: int
    tuned: str                  # "upstream default", "swept: best of ...", "default"
    seeds: list[SeedCapacity]
    mean_qps: float
    min_qps: float
    max_qps: float
    ratio_to_best_baseline: float | None = None


class WorkloadTable(msgspec.Struct, kw_only=True):
    workload: str
    config: RulerConfig
    ceiling_qps: float          # every request served, each step within the TBT target
    ceiling_90_qps: float       # the cheapest 90 % served (the bound for a 90 % target)
    best_baseline: str
    rows: list[Row]


def _job(args) -> SeedCapacity:
    subject, config, seed, start, growth = args
    return seed_capacity(subject, config, seed, start, growth)


def _subject(layout: str, chunk: int, label: str | None = None) -> Subject:
    return Subject(label=label or f"{layout}@{chunk}", layout=layout,
                   scheduler=SchedulerConfig(chunk_size=chunk))


def _row(label, subject: Subject, tuned: str, seeds: list[SeedCapacity]) -> Row:
    caps = [s.capacity_qps for s in seeds]
    return Row(label=label, layout=subject.layout, chunk_size=subject.scheduler.chunk_size,
               tuned=tuned, seeds=sorted(seeds, key=lambda s: s.seed),
               mean_qps=round(sum(caps) / len(caps), 3), min_qps=min(caps), max_qps=max(caps))


def ceilings(config: RulerConfig, num_instances: int = 3) -> tuple[float, float]:
    """(every request served, the cheapest `target` % served) on `num_instances` GPUs."""
    lengths = [(r.prompt_len, r.output_len)
               for r in workload_requests(config, 1.0, config.seeds[0])]
    classes = {s.slo_class for s in config.workload.slo_mix or () if s.share > 0}
    tbt = max([config.slo.tbt_slo, *(c.tbt_slo for c in config.workload.slo_classes
                                      if c.name in classes)])
    profile = get_profile(config.profile)
    return (ceiling_qps(profile, lengths, num_instances, tbt),
            ceiling_qps(profile, lengths, num_instances, tbt, served_share=config.target / 100))


def capacity_table(configs: Sequence[RulerConfig], ascendra_chunk: int | None = None,
                   workers: int | None = None,
                   progress: Callable[[str], None] | None = None) -> list[WorkloadTable]:
    """One table per workload config (each with its own ceiling and best baseline)."""
    chunk = ascendra_chunk or SchedulerConfig().chunk_size
    pool = ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1)
    with pool:
        starts = {c.workload.name: 0.8 * ceilings(c)[0] for c in configs}
        sweep = [(_subject(layout, size), c, c.seeds[0], starts[c.workload.name], START_GROWTH)
                 for c in configs for layout, sizes in (("3xsarathi", SARATHI_CHUNKS),
                                                        ("3xvllm", VLLM_BUDGETS))
                 for size in sizes]
        swept = _run(pool, sweep, progress, "tune")
        finals, best = [], {}
        for c in configs:
            for layout in ("3xsarathi", "3xvllm"):
                mine = [(job[0], result) for job, result in zip(sweep, swept)
                        if job[1] is c and job[0].layout == layout]
                best[(c.workload.name, layout)] = max(mine, key=lambda m: m[1].capacity_qps)
            for subject in [best[(c.workload.name, b)][0] for b in ("3xsarathi", "3xvllm")]:
                _, first = best[(c.workload.name, subject.layout)]
                start = first.capacity_qps or starts[c.workload.name]
                finals += [(subject, c, seed, start, NEAR_GROWTH) for seed in c.seeds[1:]]
            for layout in ASCENDRA:
                subject = _subject(layout, chunk, layout)
                finals.append((subject, c, c.seeds[0], starts[c.workload.name], START_GROWTH))
        measured = _run(pool, finals, progress, "measure")
        ascendra_first = {(job[1].workload.name, job[0].layout): result
                          for job, result in zip(finals, measured) if job[2] == job[1].seeds[0]}
        more = [(job[0], job[1], seed, ascendra_first[(job[1].workload.name, job[0].layout)]
                 .capacity_qps or starts[job[1].workload.name], NEAR_GROWTH)
                for job in finals if job[0].layout in ASCENDRA for seed in job[1].seeds[1:]]
        finals += more
        measured += _run(pool, more, progress, "seeds")
    return [_table(c, sweep, swept, finals, measured, best) for c in configs]


def _run(pool, jobs: list, progress, phase: str) -> list[SeedCapacity]:
    results = []
    for job, result in zip(jobs, pool.map(_job, jobs)):
        results.append(result)
        if progress:
            progress(f"[{phase} {len(results)}/{len(jobs)}] {job[1].workload.name:>11} "
                     f"{job[0].label:>16} seed {job[2]}: {result.capacity_qps:.2f} QPS "
                     f"({sum(p.wall_s for p in result.points):.0f} s)")
    return results


def _table(c: RulerConfig, sweep, swept, finals, measured, best) -> WorkloadTable:
    ceiling, ceiling_90 = ceilings(c)
    rows = []
    for job, result in zip(sweep, swept):
        subject = job[0]
        if job[1] is c and UPSTREAM.get(subject.layout) == subject.scheduler.chunk_size:
            rows.append(_row(f"{subject.layout} (upstream)", subject, "upstream default",
                             [result]))
    for layout in ("3xsarathi", "3xvllm"):
        subject, first = best[(c.workload.name, layout)]
        seeds = [first] + [r for job, r in zip(finals, measured)
                           if job[1] is c and job[0] is subject]
        sizes = SARATHI_CHUNKS if layout == "3xsarathi" else VLLM_BUDGETS
        rows.append(_row(f"{layout} (tuned)", subject,
                         f"swept: best of {list(sizes)} on seed {c.seeds[0]}", seeds))
    for layout in ASCENDRA:
        mine = [(job, r) for job, r in zip(finals, measured)
                if job[1] is c and job[0].layout == layout]
        rows.append(_row(layout, mine[0][0][0], "default", [r for _, r in mine]))
    tuned = [r for r in rows if r.tuned.startswith("swept")]
    top = max(tuned, key=lambda r: r.mean_qps)
    for row in rows:
        row.ratio_to_best_baseline = round(row.mean_qps / top.mean_qps, 3) if top.mean_qps else None
    return WorkloadTable(workload=c.workload.name, config=c, ceiling_qps=round(ceiling, 3),
                         ceiling_90_qps=round(ceiling_90, 3), best_baseline=top.label, rows=rows)
