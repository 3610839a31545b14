"""The capacity table: every workload x layout on the ruler (bench/ruler/ruler.py), baselines at
their own best, beside the hardware ceiling.

Per workload, in three phases (each phase's jobs in parallel, bench/parallel.py):

1. **scout**: vLLM V0 at its upstream budget, each Ascendra layout and each P/D split
   (`DISAGGREGATED`, DistServe) on seed 0, searched
   from the hardware ceiling (bench/ruler/ceiling.py) with a wide step;
2. **tune**: the other baseline settings on seed 0 -- Sarathi-Serve at each chunk size
   in `SARATHI_CHUNKS`, vLLM V0, vLLM V1 and SGLang at each token budget of theirs
   (`SWEEPS`) -- each searched from the scout's capacity with a narrow step; and
   Ascendra's other seeds, from its seed 0;
3. **measure**: each baseline's best-tuned setting on the other seeds, and both again with
   a drop rule (`drop_expired`: a request whose TTFT target is lost is dropped, so it
   delays no one), on every seed -- Ascendra sheds predicted misses, so the baselines
   get their own way of giving up on the hopeless.

The best baseline is the best of the tuned rows, with or without drops; a row's ratio is
its mean capacity over that row's mean capacity. Every row also has its fair capacity
(every request class at the ruler's class floor: bench/records/request_classes.py) and its ratio
to the best baseline by that rule (the best of the tuned rows' fair capacities). The
upstream defaults (`UPSTREAM`) are reported as rows of their own.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from bench.parallel import imap
from bench.ruler.ceiling import workload_ceilings
from bench.ruler.ruler import (
    NEAR_GROWTH, START_GROWTH, RulerConfig, SeedCapacity, Subject, ruler_classes, seed_capacity,
)
from daemon.layout import layout_modes
from engines.scheduler_config import SchedulerConfig
from policies.routing import Routing

SARATHI_CHUNKS = (512, 1024, 2048)
#: vLLM V0's prefill batches run whole prompts: its budget is at least the context limit.
VLLM_V0_BUDGETS = (8192, 16384)
#: vLLM V1's token budget: its A100-class server default, and its H100-class one.
VLLM_V1_BUDGETS = (2048, 8192)
#: SGLang's chunked prefill size: its A100-40GB default, and its default on 80 GB cards.
SGLANG_CHUNKS = (4096, 8192)
SWEEPS = {"3xsarathi": SARATHI_CHUNKS, "3xvllm-v0": VLLM_V0_BUDGETS,
          "3xvllm-v1": VLLM_V1_BUDGETS, "3xsglang": SGLANG_CHUNKS}
#: Upstream defaults on an A100-80GB (docs/baselines.md): Sarathi-Serve's paper runs chunk
#: 512 (strict SLOs); vLLM V0's max_num_batched_tokens is max_model_len without chunked
#: prefill; V1's OpenAI server takes 2,048 on A100-class cards; SGLang chunks at 8,192.
UPSTREAM = {"3xsarathi": 512, "3xvllm-v0": 8192, "3xvllm-v1": 2048, "3xsglang": 8192}
ASCENDRA = ("2L1H", "1L2H")
#: DistServe's prefill/decode disaggregation on the same three GPUs (issue #18): each split
#: at the default chunk size, its KV moving over the profile GPU's NVLink.
DISAGGREGATED = ("2P1D", "1P2D")
#: The step of a search that starts from a related capacity (another setting's, or the
#: same setting without drops): settings differ by more than seeds do.
SWEEP_GROWTH = 1.1


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
    drop_expired: bool = False
    fair_mean_qps: float = 0.0
    fair_min_qps: float = 0.0
    fair_max_qps: float = 0.0
    fair_ratio_to_best_baseline: float | None = None
    routing: Routing | None = None   # the row's own routing, if not the table's


class WorkloadTable(msgspec.Struct, kw_only=True):
    workload: str
    config: RulerConfig
    ceiling_qps: float          # every request served, each step within the TBT target
    ceiling_90_qps: float       # the cheapest 90 % served (the bound for a 90 % target)
    fair_ceiling_qps: float     # ... with every prompt-length class at the class floor
    best_baseline: str
    best_fair_baseline: str
    #: The prompt-length classes' bounds (the workload's quartiles, tokens).
    prompt_class_bounds: tuple[int, ...]
    rows: list[Row]
    #: seed-0 capacity of every baseline setting swept: {layout: {chunk: qps}}
    sweep: dict[str, dict[int, float]] = {}


class _Job(msgspec.Struct, frozen=True):
    subject: Subject
    config: RulerConfig
    seed: int
    start: float
    growth: float


def _run_job(job: _Job) -> SeedCapacity:
    return seed_capacity(job.subject, job.config, job.seed, job.start, job.growth)


def _subject(layout: str, chunk: int, drops: bool = False) -> Subject:
    label = f"{layout}@{chunk}" + (" drops" if drops else "")
    return Subject(label=label, layout=layout,
                   scheduler=SchedulerConfig(chunk_size=chunk, drop_expired=drops))


class _Results:
    """Every search's result, by (workload, subject label, seed)."""

    def __init__(self, workers: int | None, progress) -> None:
        self.workers, self.progress, self.found = workers, progress, {}

    def run(self, jobs: list[_Job], phase: str) -> None:
        for n, (job, result) in enumerate(zip(jobs, imap(_run_job, jobs, self.workers)),
                                          start=1):
            self.found[(job.config.workload.name, job.subject.label, job.seed)] = result
            if self.progress:
                self.progress(f"[{phase} {n}/{len(jobs)}] {job.config.workload.name:>11} "
                              f"{job.subject.label:>16} seed {job.seed}: "
                              f"{result.capacity_qps:.2f} QPS "
                              f"({sum(p.wall_s for p in result.points):.0f} s)")

    def get(self, c: RulerConfig, subject: Subject, seed: int) -> SeedCapacity:
        return self.found[(c.workload.name, subject.label, seed)]

    def qps(self, c: RulerConfig, subject: Subject, seed: int, fallback: float) -> float:
        return self.get(c, subject, seed).capacity_qps or fallback


def capacity_table(configs: Sequence[RulerConfig], ascendra_chunk: int | None = None,
                   workers: int | None = None,
                   progress: Callable[[str], None] | None = None) -> list[WorkloadTable]:
    """One table per workload config (each with its own ceiling and best baseline)."""
    chunk = ascendra_chunk or SchedulerConfig().chunk_size
    ascendra = [Subject(label=layout, layout=layout, scheduler=SchedulerConfig(chunk_size=chunk))
                for layout in ASCENDRA + DISAGGREGATED]
    scout = _subject("3xvllm-v0", UPSTREAM["3xvllm-v0"])
    starts = {c.workload.name: 0.8 * workload_ceilings(c).all_served_qps for c in configs}
    found = _Results(workers, progress)
    found.run([_Job(s, c, c.seeds[0], starts[c.workload.name], START_GROWTH)
               for c in configs for s in (scout, *ascendra)], "scout")
    tune = []
    for c in configs:
        near = found.qps(c, scout, c.seeds[0], starts[c.workload.name])
        tune += [_Job(_subject(layout, size), c, c.seeds[0], near, SWEEP_GROWTH)
                 for layout, sizes in SWEEPS.items() for size in sizes
                 if _subject(layout, size) != scout]
        tune += [_Job(s, c, seed, found.qps(c, s, c.seeds[0], near), NEAR_GROWTH)
                 for s in ascendra for seed in c.seeds[1:]]
    found.run(tune, "tune")
    best = {(c.workload.name, layout): _best(found, c, layout)
            for c in configs for layout in SWEEPS}
    measure = []
    for c in configs:
        for layout in SWEEPS:
            subject = best[(c.workload.name, layout)]
            near = found.qps(c, subject, c.seeds[0], starts[c.workload.name])
            measure += [_Job(subject, c, seed, near, NEAR_GROWTH) for seed in c.seeds[1:]]
            with_drops = _subject(layout, subject.scheduler.chunk_size, drops=True)
            measure += [_Job(with_drops, c, seed, near, SWEEP_GROWTH) for seed in c.seeds]
    found.run(measure, "measure")
    return [_table(c, found, best, ascendra) for c in configs]


def _best(found: _Results, c: RulerConfig, layout: str) -> Subject:
    """The setting of `layout` with the highest seed-0 capacity."""
    return max((_subject(layout, size) for size in SWEEPS[layout]),
               key=lambda s: found.get(c, s, c.seeds[0]).capacity_qps)


def _row(label: str, subject: Subject, tuned: str, seeds: list[SeedCapacity]) -> Row:
    caps = [s.capacity_qps for s in seeds]
    fair = [s.fair_capacity_qps for s in seeds]
    return Row(label=label, layout=subject.layout, chunk_size=subject.scheduler.chunk_size,
               tuned=tuned, seeds=sorted(seeds, key=lambda s: s.seed),
               mean_qps=round(sum(caps) / len(caps), 3), min_qps=min(caps), max_qps=max(caps),
               drop_expired=subject.scheduler.drop_expired,
               fair_mean_qps=round(sum(fair) / len(fair), 3), fair_min_qps=min(fair),
               fair_max_qps=max(fair), routing=subject.routing)


def _table(c: RulerConfig, found: _Results, best: dict, ascendra: list[Subject]) -> WorkloadTable:
    ceiling = workload_ceilings(c)
    first = c.seeds[0]
    rows = [_row(f"{layout} (upstream)", s, "upstream default", [found.get(c, s, first)])
            for layout, size in UPSTREAM.items() for s in [_subject(layout, size)]]
    for layout, sizes in SWEEPS.items():
        subject = best[(c.workload.name, layout)]
        swept = f"swept: best of {list(sizes)} on seed {first}"
        rows.append(_row(f"{layout} (tuned)", subject, swept,
                         [found.get(c, subject, seed) for seed in c.seeds]))
        with_drops = _subject(layout, subject.scheduler.chunk_size, drops=True)
        rows.append(_row(f"{layout} (tuned, drops)", with_drops, swept + ", drop_expired",
                         [found.get(c, with_drops, seed) for seed in c.seeds]))
    rows += [_row(s.layout, s, "default", [found.get(c, s, seed) for seed in c.seeds])
             for s in ascendra]
    top, fair_top = _rank(rows, [r for r in rows if r.tuned.startswith("swept")])
    sweep = {layout: {size: found.get(c, _subject(layout, size), first).capacity_qps
                      for size in sizes} for layout, sizes in SWEEPS.items()}
    return WorkloadTable(workload=c.workload.name, config=c,
                         ceiling_qps=ceiling.all_served_qps, ceiling_90_qps=ceiling.cheapest_qps,
                         fair_ceiling_qps=ceiling.fair_qps, best_baseline=top.label,
                         best_fair_baseline=fair_top.label,
                         prompt_class_bounds=ruler_classes(c).prompt_bounds,
                         rows=rows, sweep=sweep)


def _rank(rows: list[Row], baselines: list[Row]) -> tuple[Row, Row]:
    """The best baseline by capacity and by fair capacity; every row's ratio to each."""
    top = max(baselines, key=lambda r: r.mean_qps)
    fair_top = max(baselines, key=lambda r: r.fair_mean_qps)
    for row in rows:
        row.ratio_to_best_baseline = _ratio(row.mean_qps, top.mean_qps)
        row.fair_ratio_to_best_baseline = _ratio(row.fair_mean_qps, fair_top.fair_mean_qps)
    return top, fair_top


def _ratio(qps: float, best: float) -> float | None:
    return round(qps / best, 3) if best else None


def settings_table(configs: Sequence[RulerConfig], settings: Sequence[str],
                   workers: int | None = None,
                   progress: Callable[[str], None] | None = None) -> list[WorkloadTable]:
    """A table of given settings only -- `layout@chunk`, `layout@chunk+drops` (either with
    `/ROUTING` for a baseline's own routing), or an Ascendra layout -- each on every seed,
    searched from the ceiling: no sweep, so a baseline is only as tuned as the setting
    named (say which, and where it was tuned). The cheap way to a table when the full sweep
    (`capacity_table`) takes too long."""
    subjects = parse_settings(settings)
    starts = {c.workload.name: 0.8 * workload_ceilings(c).all_served_qps for c in configs}
    found = _Results(workers, progress)
    found.run([_Job(s, c, seed, starts[c.workload.name], START_GROWTH)
               for c in configs for s in subjects for seed in c.seeds], "settings")
    tables = []
    for c in configs:
        rows = [_row(s.label, s, "given" if s.layout in SWEEPS else "default",
                     [found.get(c, s, seed) for seed in c.seeds]) for s in subjects]
        ceiling = workload_ceilings(c)
        top, fair_top = _rank(rows, [r for r in rows if r.layout in SWEEPS])
        tables.append(WorkloadTable(
            workload=c.workload.name, config=c, ceiling_qps=ceiling.all_served_qps,
            ceiling_90_qps=ceiling.cheapest_qps, fair_ceiling_qps=ceiling.fair_qps,
            best_baseline=top.label, best_fair_baseline=fair_top.label,
            prompt_class_bounds=ruler_classes(c).prompt_bounds, rows=rows))
    return tables


def parse_settings(settings: Sequence[str]) -> list[Subject]:
    """`settings_table`'s subjects; a ValueError naming the problem if one is malformed or
    none is a baseline (every ratio divides by the best baseline)."""
    subjects = [parse_setting(s) for s in settings]
    if not any(s.layout in SWEEPS for s in subjects):
        raise ValueError(f"settings {','.join(settings)!r} name no baseline (layout@chunk or "
                         "layout@chunk+drops): every ratio divides by the best baseline")
    return subjects


def parse_setting(text: str) -> Subject:
    """`3xsglang@4096+drops` -> that baseline setting; `2L1H` -> the layout at defaults;
    a `/round_robin` (any routing) after a baseline setting: its own routing."""
    setting, _, routing = text.partition("/")
    layout, _, rest = setting.partition("@")
    try:
        layout_modes(layout)
    except ValueError as error:
        raise ValueError(f"setting {text!r}: {error}") from None
    if not rest:
        if routing:
            raise ValueError(f"setting {text!r}: only a baseline setting takes its own routing")
        return Subject(label=layout, layout=layout)
    chunk, _, drops = rest.partition("+")
    if drops not in ("", "drops") or not chunk.isdigit():
        raise ValueError(f"setting {text!r}: write layout@chunk or layout@chunk+drops, "
                         "the chunk a number of tokens")
    subject = _subject(layout, int(chunk), drops=bool(drops))
    if not routing:
        return subject
    try:
        own = Routing(routing)
    except ValueError:
        raise ValueError(f"setting {text!r}: routing {routing!r} is not one of "
                         f"{', '.join(r.value for r in Routing)}") from None
    return msgspec.structs.replace(subject, label=f"{subject.label} {own.value}", routing=own)
