"""What each part of Ascendra's policy earns: capacity of 2L1H with one part taken away at
a time, on the ruler (bench/ruler/ruler.py; one seed), beside all-LP with the global queue.

Variants (ControllerConfig switches; everything else at its default):
* `2L1H`                -- everything on;
* `3L0H`                -- no HP: three LPs behind the global queue;
* `no global queue`     -- each request to an LP on arrival, LPs offload to the HP (the
                           paper's routing);
* `no shedding`         -- `shed = keep`: requests predicted to miss stay in deadline order;
* `no HP gate`          -- offloads go to the HP with the shortest queue whatever its
                           backlog, and the controller rescues nothing itself;
* `3A`                  -- roles chosen online (docs/design.md §5.10).

Beside them, on the same ruler and seed, the best faithful baselines of the capacity
table (docs/results.md), at their tuned settings with their drop rule: so each part's
worth reads against what a real system serves, not only against 2L1H.

`VALUE_VARIANTS` compares the LP instances' value functions the same way (2L1H, all else
at its default): the evidence behind the default `value_function`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from bench.loadgen.workloads import workload
from bench.parallel import imap
from bench.ruler.ceiling import workload_ceilings
from bench.ruler.ruler import RulerConfig, SeedCapacity, Subject, seed_capacity
from daemon.core.controller_config import ControllerConfig
from engines.scheduler_config import SchedulerConfig
from policies.value import VALUE_FUNCTIONS

#: label -> (layout, ControllerConfig switches, SchedulerConfig switches)
Variants = dict[str, tuple[str, dict, dict]]

VARIANTS: Variants = {
    "2L1H": ("2L1H", {}, {}),
    "3L0H": ("3L0H", {}, {}),
    "no global queue": ("2L1H", {"global_queue": False}, {}),
    "no shedding": ("2L1H", {"shed": "keep"}, {}),
    "no HP gate": ("2L1H", {"hp_gate": False}, {}),
    "3A": ("3A", {}, {}),
    "3xvllm-v0@8192+drops": ("3xvllm-v0", {}, {"chunk_size": 8192, "drop_expired": True}),
    "3xsglang@4096+drops": ("3xsglang", {}, {"chunk_size": 4096, "drop_expired": True}),
}
VALUE_VARIANTS: Variants = {f"2L1H {name}": ("2L1H", {}, {"value_function": name})
                            for name in VALUE_FUNCTIONS if name != "ljf"}


def _job(job) -> SeedCapacity:
    subject, config, start = job
    return seed_capacity(subject, config, config.seeds[0], start)


def ablation(workloads: Sequence[str], measured: int, workers: int | None = None,
             progress: Callable[[str], None] | None = None,
             variants: Variants = VARIANTS) -> list[dict]:
    jobs, labels = [], []
    for name in workloads:
        base = RulerConfig(workload=workload(name), measured=measured, seeds=(0,))
        start = 0.8 * workload_ceilings(base).all_served_qps
        for label, (layout, switches, scheduler) in variants.items():
            config = msgspec.structs.replace(base, controller=msgspec.convert(
                switches, ControllerConfig))
            jobs.append((Subject(label=label, layout=layout,
                                 scheduler=msgspec.convert(scheduler, SchedulerConfig)),
                         config, start))
            labels.append((name, label))
    rows = []
    for (name, label), result in zip(labels, imap(_job, jobs, workers)):
        rows.append({"workload": name, "variant": label,
                     "capacity_qps": result.capacity_qps,
                     "fair_capacity_qps": result.fair_capacity_qps,
                     "points": msgspec.to_builtins(result.points)})
        if progress:
            progress(f"{name:>11} {label:>16}: {result.capacity_qps:.2f} QPS")
    return rows
