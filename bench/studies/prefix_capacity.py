"""Prefix caching on the capacity ruler (bench/ruler/ruler.py): what caching, and routing that
knows what is cached, are worth on a workload with reuse (default: multi-turn).

Per seed, each subject's capacity is searched alike, and the ratios are printed side by
side (mean capacities over the seeds):

* caching on vs off -- 3xsarathi and 2L1H, prefix-aware routing on (off: nothing is
  cached, so routing has nothing to know);
* prefix-aware vs blind routing, caching on -- 3xsarathi against round-robin, 2L1H's
  global queue against binding by backlog alone (`routing = least_loaded`);
* 2L1H's global queue (late binding) on vs off, caching on: what waiting at the
  controller costs once caching has made prefills cheap;
* with `--table`, the whole capacity table (bench/ruler/capacity_table.py) on the workload:
  2L1H against the best tuned baseline, every baseline with caching on too.

    python -m bench.studies.prefix_capacity [--workload multi-turn] [--measured 4500]
        [--seeds 0,1,2] [--table [--table-measured N]] [--workers N] [--json OUT]
"""
from __future__ import annotations

import argparse

import msgspec

from bench.json_file import write_json
from bench.loadgen.reuse_workloads import ideal_reuse
from bench.loadgen.workloads import workload
from bench.parallel import add_workers_flag, imap
from bench.ruler.capacity_table import capacity_table
from bench.ruler.ceiling import workload_ceilings
from bench.ruler.ruler import START_GROWTH, RulerConfig, SeedCapacity, Subject, seed_capacity, \
    workload_requests
from daemon.core.controller_config import ControllerConfig
from engines.scheduler_config import SchedulerConfig
from policies.routing import Routing

#: (label, layout, prefix caching, routing, global queue)
SUBJECTS = (
    ("3xsarathi", "3xsarathi", True, Routing.PREFIX_AWARE, True),
    ("3xsarathi no caching", "3xsarathi", False, Routing.PREFIX_AWARE, True),
    ("3xsarathi round-robin", "3xsarathi", True, Routing.ROUND_ROBIN, True),
    ("2L1H", "2L1H", True, Routing.PREFIX_AWARE, True),
    ("2L1H no caching", "2L1H", False, Routing.PREFIX_AWARE, True),
    ("2L1H blind binding", "2L1H", True, Routing.LEAST_LOADED, True),
    ("2L1H no global queue", "2L1H", True, Routing.PREFIX_AWARE, False),
)
#: (what, numerator label, denominator label)
RATIOS = (
    ("caching on / off, 3xsarathi", "3xsarathi", "3xsarathi no caching"),
    ("caching on / off, 2L1H", "2L1H", "2L1H no caching"),
    ("prefix-aware / round-robin, 3xsarathi", "3xsarathi", "3xsarathi round-robin"),
    ("prefix-aware / blind binding, 2L1H", "2L1H", "2L1H blind binding"),
    ("global queue on / off, 2L1H", "2L1H", "2L1H no global queue"),
    ("2L1H / 3xsarathi, caching on", "2L1H", "3xsarathi"),
)


class SubjectResult(msgspec.Struct, kw_only=True):
    label: str
    layout: str
    prefix_caching: bool
    routing: str
    global_queue: bool
    mean_qps: float
    seeds: list[SeedCapacity]


class PrefixCapacity(msgspec.Struct, kw_only=True):
    workload: str
    #: Share of prompt tokens an unbounded cache would find, at the first subject's capacity.
    ideal_reuse: float
    config: RulerConfig
    subjects: list[SubjectResult]
    ratios: dict[str, float | None]
    table: list | None = None    # capacity_table's WorkloadTable, with --table


def _job(job: tuple) -> tuple[str, SeedCapacity]:
    label, layout, caching, routing, global_queue, config, seed, start = job
    subject = Subject(label=label, layout=layout,
                      scheduler=SchedulerConfig(prefix_caching=caching))
    controller = msgspec.structs.replace(config.controller, routing=routing,
                                         global_queue=global_queue)
    config = msgspec.structs.replace(config, controller=controller)
    return label, seed_capacity(subject, config, seed, start, START_GROWTH)


def prefix_capacity(config: RulerConfig, workers: int | None = None,
                    table: RulerConfig | None = None, progress=print) -> PrefixCapacity:
    """Every subject's capacity per seed; with `table`, also the capacity table on that
    config (the same workload, perhaps fewer measured requests: it searches ~27 times)."""
    start = 0.8 * workload_ceilings(config).all_served_qps
    jobs = [(*subject, config, seed, start) for subject in SUBJECTS for seed in config.seeds]
    found: dict[str, list[SeedCapacity]] = {}
    for label, result in imap(_job, jobs, workers):
        found.setdefault(label, []).append(result)
        progress(f"{label:>22} seed {result.seed}: {result.capacity_qps:.2f} QPS")
    subjects = [SubjectResult(label=label, layout=layout, prefix_caching=caching,
                              routing=routing.value, global_queue=global_queue,
                              seeds=found[label],
                              mean_qps=round(sum(s.capacity_qps for s in found[label])
                                             / len(found[label]), 3))
                for label, layout, caching, routing, global_queue in SUBJECTS]
    mean = {s.label: s.mean_qps for s in subjects}
    ratios = {what: round(mean[a] / mean[b], 3) if mean[b] else None for what, a, b in RATIOS}
    at = subjects[0].mean_qps or 1.0  # a run's reuse depends on its rate (conversations span it)
    reuse = ideal_reuse(workload_requests(config, at, config.seeds[0]), 16)
    tables = capacity_table([table], workers=workers, progress=progress) if table else None
    return PrefixCapacity(workload=config.workload.name, ideal_reuse=round(reuse, 3),
                          config=config, subjects=subjects, ratios=ratios, table=tables)


def print_report(result: PrefixCapacity) -> None:
    print(f"workload {result.workload}: an unbounded prefix cache finds "
          f"{100 * result.ideal_reuse:.1f} % of its prompt tokens (at "
          f"{result.subjects[0].mean_qps:.2f} QPS); {result.config.measured} "
          f"measured requests, seeds {list(result.config.seeds)}")
    for s in result.subjects:
        seeds = ", ".join(f"{c.capacity_qps:.2f}" for c in s.seeds)
        print(f"  {s.label:>22}: {s.mean_qps:6.2f} QPS  (seeds {seeds})")
    for what, ratio in result.ratios.items():
        print(f"  {what:>40}: {'-' if ratio is None else f'{ratio:.2f}x'}")
    for table in result.table or ():
        print(f"  capacity table ({table.config.measured} measured requests a point), best "
              f"baseline {table.best_baseline}:")
        for row in table.rows:
            ratio = row.ratio_to_best_baseline
            print(f"    {row.label:>24}: {row.mean_qps:6.2f} QPS [{row.min_qps:.2f}-{row.max_qps:.2f}]  "
                  f"{'' if ratio is None else f'{ratio:.2f}x best baseline'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.prefix_capacity",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="multi-turn")
    parser.add_argument("--measured", type=int, default=RulerConfig().measured)
    parser.add_argument("--seeds", default="0,1,2")
    add_workers_flag(parser)
    parser.add_argument("--table", action="store_true",
                        help="also the capacity table: 2L1H vs the best tuned baseline")
    parser.add_argument("--table-measured", type=int,
                        help="measured requests per point of the table (default: --measured)")
    parser.add_argument("--json", help="write the result (PrefixCapacity) here")
    args = parser.parse_args(argv)
    config = RulerConfig(workload=workload(args.workload), measured=args.measured,
                         seeds=tuple(int(s) for s in args.seeds.split(",")),
                         controller=ControllerConfig())
    table = msgspec.structs.replace(config, measured=args.table_measured or config.measured)
    result = prefix_capacity(config, args.workers, table if args.table else None)
    print_report(result)
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
