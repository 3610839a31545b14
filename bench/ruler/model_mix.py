"""Several models on one box, by simulation: placements of N GPUs for a mix of models
(MuxServe's placement by popularity), each model's goodput, and a box's capacity.

A *placement* is a list of groups; a group's instances hold its models (several: a
multiplexed group, engines/mux_core.py; one: dedicated) and run one mode each (Sarathi
peers, or Ascendra's LP/HP roles). Each group has a controller of its own, as `serve`
gives it (daemon/model_plan.py), so a group is simulated alone on its models' requests.
Every model is in exactly one group.

A box's *capacity* under a mix is the highest total rate at which every model holds
90 % goodput (both targets), found by bisection (bench/ruler/capacity.py) over whole runs
of `num_requests` requests -- a reduced protocol (no warm-up cut, no per-window check),
labelled as such wherever it is printed.
"""
from __future__ import annotations

import dataclasses
import itertools
import random

import msgspec

from bench.loadgen.workload import WorkloadRequest
from bench.loadgen.workloads import WorkloadSpec, build_requests, workload
from bench.records.results import is_good, percentiles
from bench.ruler.capacity import CAPACITY_TARGET, find_capacity
from bench.sim.sim_instances import SimConfig
from bench.sim.simulator import Simulation
from daemon.core.controller_config import SloConfig
from daemon.layout import layout_modes
from engines.scheduler_config import SchedulerConfig

PROTOCOL = "reduced: whole runs of {n} requests, no warm-up cut, bisection to {tol:g} %"


@dataclasses.dataclass(frozen=True)
class Group:
    models: tuple[str, ...]  # the served names its instances hold (the first the default)
    layout: str              # its instances and their modes, e.g. "2xsarathi", "1L1H"

    @property
    def gpus(self) -> int:
        return len(layout_modes(self.layout))


@dataclasses.dataclass(frozen=True)
class Placement:
    groups: tuple[Group, ...]

    @property
    def label(self) -> str:
        return " + ".join(f"{'+'.join(g.models)}:{g.layout}" for g in self.groups)

    @property
    def multiplexed(self) -> bool:
        return any(len(g.models) > 1 for g in self.groups)


def parse_mix(text: str) -> dict[str, float]:
    """`A=0.8,B=0.2` -> {"A": 0.8, "B": 0.2}, shares normalised to sum 1."""
    mix = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, equals, share = item.partition("=")
        try:
            value = float(share)
        except ValueError:
            value = -1.0
        if not equals or not name.strip() or value <= 0:
            raise ValueError(f"--model-mix: {item!r} is not NAME=SHARE with SHARE > 0")
        mix[name.strip()] = value
    if len(mix) < 2:
        raise ValueError("--model-mix: name at least two models, e.g. A=0.8,B=0.2")
    total = sum(mix.values())
    return {name: share / total for name, share in mix.items()}


def _group_layouts(gpus: int, roles: bool) -> list[str]:
    """A group's layouts: Sarathi peers, and with `roles` (two GPUs or more) one HP."""
    layouts = [f"{gpus}xsarathi"]
    if roles and gpus > 1:
        layouts.append(f"{gpus - 1}L1H")
    return layouts


def candidate_placements(num_gpus: int, mix: dict[str, float], roles: bool = True,
                         ) -> list[Placement]:
    """Every dedicated split of the GPUs (each model at least one), each group as Sarathi
    peers or with roles; every GPU multiplexing every model, likewise; and vLLM V1
    dedicated, split by popularity (the per-model baseline)."""
    models = list(mix)
    if num_gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {num_gpus}")
    out = []
    for split in _splits(num_gpus, len(models)):
        for layouts in itertools.product(*(_group_layouts(k, roles) for k in split)):
            out.append(Placement(tuple(Group((m,), layout)
                                       for m, layout in zip(models, layouts))))
    for layout in _group_layouts(num_gpus, roles):
        out.append(Placement((Group(tuple(models), layout),)))
    by_popularity = popularity_split(num_gpus, mix)
    if by_popularity is not None:
        out.append(Placement(tuple(Group((m,), f"{k}xvllm-v1")
                                   for m, k in zip(models, by_popularity))))
    return out


def _splits(total: int, parts: int) -> list[tuple[int, ...]]:
    """Ways to give `total` GPUs to `parts` models, each at least one."""
    if parts == 1:
        return [(total,)] if total >= 1 else []
    return [(k, *rest) for k in range(total - parts + 1, 0, -1)
            for rest in _splits(total - k, parts - 1)]


def popularity_split(num_gpus: int, mix: dict[str, float]) -> tuple[int, ...] | None:
    """GPUs per model in proportion to its share (largest remainders), each at least one;
    None when there are fewer GPUs than models."""
    if num_gpus < len(mix):
        return None
    shares = list(mix.values())
    base = [max(1, int(num_gpus * s)) for s in shares]
    while sum(base) > num_gpus:
        base[base.index(max(base))] -= 1
    order = sorted(range(len(shares)), key=lambda i: num_gpus * shares[i] - base[i], reverse=True)
    for i in itertools.islice(itertools.cycle(order), num_gpus - sum(base)):
        base[i] += 1
    return tuple(base)


@dataclasses.dataclass(frozen=True)
class MixRun:
    """What every run of a capacity search shares."""

    mix: tuple[tuple[str, float], ...]      # (model, share)
    profiles: tuple[tuple[str, str], ...]   # (model, GPU profile)
    seed: int = 0
    num_requests: int = 600
    scheduler: SchedulerConfig = SchedulerConfig(chunk_size=2048)
    slo: SloConfig = SloConfig()
    #: the arrivals and lengths (bench/loadgen/workloads.py), Poisson on ShareGPT's lengths
    workload: WorkloadSpec = dataclasses.field(default_factory=lambda: workload("poisson"))


def assign_models(requests: list[WorkloadRequest], mix: dict[str, float], seed: int,
                  ) -> list[WorkloadRequest]:
    """Each request for a model drawn by the mix's shares (seeded): one uniform draw a
    request, the first model whose cumulative share passes it."""
    rng = random.Random(seed * 7919 + 17)
    bounds = list(itertools.accumulate(mix.values()))
    names = list(mix)
    return [msgspec.structs.replace(r, model=names[min(
        next((i for i, b in enumerate(bounds) if u < b), len(names) - 1), len(names) - 1)])
        for r, u in ((r, rng.random()) for r in requests)]


def simulate(placement: Placement, run: MixRun, rate: float) -> list:
    """Every record of one run at `rate` total QPS, each naming its model."""
    mix, profiles = dict(run.mix), dict(run.profiles)
    requests = assign_models(build_requests(run.workload, rate=rate,
                                            num_requests=run.num_requests, seed=run.seed,
                                            max_model_len=8192), mix, run.seed)
    records = []
    for group in placement.groups:
        mine = [r for r in requests if r.model in group.models]
        if not mine:
            continue
        base = SimConfig(layout_modes=tuple(layout_modes(group.layout)),
                         profile=profiles[group.models[0]], scheduler=run.scheduler,
                         slo=run.slo)
        if len(group.models) > 1:
            config = dataclasses.replace(base, models=tuple((m, profiles[m])
                                                            for m in group.models))
            records += Simulation(config, mine).run()
            continue
        for record in Simulation(base, [msgspec.structs.replace(r, model="")
                                        for r in mine]).run():
            records.append(msgspec.structs.replace(record, model=group.models[0]))
    return records


def per_model(records: list, models, slo: SloConfig) -> dict[str, dict]:
    """Each model's requests, goodput %, p99 TTFT and mean TBT (s) of its completed ones."""
    out = {}
    for model in models:
        mine = [r for r in records if r.model == model]
        done = [r for r in mine if r.outcome == "completed"]
        good = sum(is_good(r, slo.ttft_slo, slo.tbt_slo) for r in mine)
        out[model] = {
            "requests": len(mine),
            "goodput_pct": round(100 * good / len(mine), 1) if mine else None,
            "p99_ttft_s": _round(percentiles([r.ttft() for r in done]).p99),
            "mean_tbt_s": _round(percentiles([t for r in done
                                              if (t := r.mean_tbt()) is not None]).mean)}
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def capacity(placement: Placement, run: MixRun, *, tolerance: float = 0.04,
             max_runs: int = 9) -> dict:
    """The highest total rate at which every model holds CAPACITY_TARGET, each model's
    numbers there, and every rate tried."""
    models, seen = [m for m, _ in run.mix], {}

    def holds(rate: float) -> bool:
        seen[rate] = per_model(simulate(placement, run, rate), models, run.slo)
        return all((m["goodput_pct"] or 0.0) >= CAPACITY_TARGET for m in seen[rate].values())

    gpus = sum(g.gpus for g in placement.groups)
    qps = find_capacity(holds, start_qps=1.0 * gpus, tolerance=tolerance, max_runs=max_runs)
    return {"placement": placement.label, "multiplexed": placement.multiplexed,
            "capacity_qps": round(qps, 3), "at_capacity": seen.get(qps),
            "runs": {f"{r:.3f}": v for r, v in sorted(seen.items())}}
