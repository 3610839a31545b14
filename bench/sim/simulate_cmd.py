"""`ascendra simulate` and `ascendra capacity`: the simulator from the command line.

Both take the scheduler, SLO and controller settings as `serve` does -- the same flags
from the same structs (daemon/config.py `add_config_flags`), so a simulated run has the
daemon's defaults unless told otherwise -- plus the workload flags
(bench/loadgen/workload_flags.py). `capacity` measures by the ruler's protocol
(bench/ruler/ruler.py) and prints the configuration it used with its answer.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

import msgspec

from bench.loadgen.shifting import per_phase
from bench.loadgen.tenant_mix import mix_text, tenant_rates
from bench.loadgen.workloads import build_requests, num_requests_or
from bench.parallel import add_workers_flag, run_parallel
from bench.records.records_file import record_rows, write_records
from bench.records.results import print_summary, write_result
from bench.ruler.capacity import CAPACITY_TARGET
from bench.ruler.ceiling import workload_ceilings
from bench.ruler.ruler import (
    RulerConfig, SeedCapacity, Subject, point_rows, ruler_classes, seed_capacity, sim_config,
)
from bench.sim.fleet_cli import add_fleet_flags, is_fleet, run_fleet_simulate
from bench.sim.sim_flags import (
    add_fair_floor_flag, add_sim_flags, add_start_growth_flag, sim_settings,
)
from bench.sim.box_run import simulate
from bench.sim.speed_trace import read_speed_trace
from daemon.core.controller_config import TenantsConfig
from daemon.layout import layout_modes

DEFAULT_NUM_REQUESTS = 2000


def add_simulate_arguments(p: argparse.ArgumentParser) -> None:
    add_sim_flags(p)
    p.add_argument("--num-requests", type=int, default=None,
                   help=f"requests to simulate (default {DEFAULT_NUM_REQUESTS}, or every row of a "
                        "trace file with arrival times)")
    p.add_argument("--qps", type=float, default=None,
                   help="arrival rate, requests/s (needed but for a replayed trace: there it "
                        "rescales the trace's times to this mean rate)")
    p.add_argument("--json", metavar="OUT", help="write the result JSON here")
    p.add_argument("--records", metavar="FILE",
                   help="write one line per request to FILE (JSONL, or .parquet); read it with "
                        "`ascendra records FILE`")
    p.add_argument("--speed-trace", metavar="FILE",
                   help="replay a live run's speed: each step's time times the factor of "
                        "its window (bench/sim/speed_trace.py; a diagnostic)")
    add_fleet_flags(p)
    p.set_defaults(run=run_simulate)


def add_capacity_arguments(p: argparse.ArgumentParser) -> None:
    add_sim_flags(p)
    p.add_argument("--target", type=float, default=CAPACITY_TARGET,
                   help="goodput %% to hold (default %(default)s)")
    p.add_argument("--measured", type=int, default=RulerConfig().measured,
                   help="measured requests per point, warm-up and cool-down excluded "
                        "(default %(default)s)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--start-qps", type=float, default=None,
                   help="where the search starts (default: 0.8 x the hardware ceiling)")
    add_start_growth_flag(p)
    add_fair_floor_flag(p)
    p.add_argument("--tolerance", type=float, default=RulerConfig().tolerance,
                   help="stop once the bracket is this narrow, relative (default %(default)s)")
    add_workers_flag(p)
    p.add_argument("--json", metavar="OUT", help="write the answer (config, seeds, points) here")
    p.add_argument("--records", metavar="FILE",
                   help="per-request records of the first seed's run at its capacity")
    p.set_defaults(run=run_capacity)


def run_simulate(args: argparse.Namespace) -> int:
    subject, config = sim_settings(args)
    if is_fleet(args):
        if args.speed_trace:
            raise ValueError("--speed-trace replays one box's live run; not with a fleet")
        return run_fleet_simulate(args, subject, config, DEFAULT_NUM_REQUESTS)
    n = args.num_requests if args.num_requests is not None else num_requests_or(
        config.workload, DEFAULT_NUM_REQUESTS)
    if n < 1:
        raise ValueError(f"--num-requests must be >= 1, got {n}")
    requests = build_requests(config.workload, rate=args.qps, num_requests=n, seed=args.seed,
                              max_model_len=config.max_model_len)
    run_config = {"layout": args.layout, "qps": args.qps, **_printable(subject, config)}
    if config.workload.tenant_mix:
        print(mix_text(config.workload.tenant_mix, args.qps))
        if args.qps is not None:
            run_config["tenant_rates"] = tenant_rates(config.workload.tenant_mix, args.qps)
    shifting = config.workload.arrival == "shifting"
    box = sim_config(subject, config)
    if args.speed_trace:
        box = dataclasses.replace(box, speed_trace=read_speed_trace(args.speed_trace))
        run_config["speed_trace"] = args.speed_trace
    result = simulate(box, requests, seed=args.seed, config=run_config,
                      keep_records=bool(args.records) or shifting)
    if shifting:  # goodput by phase: which traffic each layout serves well
        result = msgspec.structs.replace(result, per_phase=per_phase(
            result.records, config.workload.phase_seconds, config.slo.ttft_slo,
            config.slo.tbt_slo))
    rows = (record_rows(result.records, config.slo.ttft_slo, config.slo.tbt_slo)
            if args.records else None)
    result = msgspec.structs.replace(result, records=msgspec.UNSET)
    print_summary(result)
    print(config.slo_scale.describe())
    print("(times are simulated seconds, on the simulator's virtual clock)")
    for phase in result.per_phase:
        print(f"phase {phase.phase}: goodput {phase.goodput_pct:.1f} % "
              f"({phase.good} of {phase.num_requests})")
    if args.json:
        write_result(result, args.json)
        print(f"result written to {args.json}")
    if rows is not None:
        write_records(args.records, rows)
        print(f"records written to {args.records}")
    return 0


class CapacityAnswer(msgspec.Struct, kw_only=True):
    subject: Subject
    config: RulerConfig
    ceiling_qps: float
    ceiling_target_qps: float      # serving only the cheapest `target` % of the requests
    fair_ceiling_qps: float        # ... with every prompt-length class at the fair floor
    #: The request classes' bounds (prompt-length quartiles of the workload, tokens).
    prompt_class_bounds: tuple[int, ...]
    mean_qps: float
    min_qps: float
    max_qps: float
    fair_mean_qps: float           # every class at `config.fair_floor` too
    fair_min_qps: float
    fair_max_qps: float
    seeds: list[SeedCapacity]
    #: False when the run is too short for steady state or a capacity passes a hard bound;
    #: `warnings` says which (bench/ruler/short_run.py).
    steady_state: bool = True
    warnings: list[str] = []


def run_capacity(args: argparse.Namespace) -> int:
    if not args.start_growth > 1:
        print(f"ascendra capacity: error: --start-growth must be > 1, got {args.start_growth}",
              file=sys.stderr)
        return 2
    subject, config = sim_settings(args)
    seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
    config = msgspec.structs.replace(config, seeds=seeds, target=args.target,
                                     measured=args.measured, tolerance=args.tolerance,
                                     fair_floor=args.fair_floor)
    ceiling = workload_ceilings(config, len(layout_modes(subject.layout)))
    start = args.start_qps or 0.8 * ceiling.all_served_qps
    print(readable_config(_printable(subject, config)), file=sys.stderr)
    jobs = [(subject, config, seed, start, args.start_growth) for seed in seeds]
    results = run_parallel(_seed_job, jobs, args.workers)
    caps = [r.capacity_qps for r in results]
    fair = [r.fair_capacity_qps for r in results]
    answer = CapacityAnswer(subject=subject, config=config, ceiling_qps=ceiling.all_served_qps,
                            ceiling_target_qps=ceiling.cheapest_qps,
                            fair_ceiling_qps=ceiling.fair_qps,
                            prompt_class_bounds=ruler_classes(config).prompt_bounds,
                            mean_qps=round(sum(caps) / len(caps), 3), min_qps=min(caps),
                            max_qps=max(caps), fair_mean_qps=round(sum(fair) / len(fair), 3),
                            fair_min_qps=min(fair), fair_max_qps=max(fair), seeds=results)
    warnings = capacity_warnings(answer)
    answer = msgspec.structs.replace(answer, steady_state=not warnings, warnings=warnings)
    print(capacity_table(answer))
    if config.workload.tenant_mix:
        print("at the capacity, " + mix_text(config.workload.tenant_mix, answer.mean_qps))
    _warn_unbracketed(results, config)
    if args.json:
        text = msgspec.json.format(msgspec.json.encode(answer), indent=2).decode()
        with open(args.json, "w") as f:
            f.write(text + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    if args.records and caps[0] > 0:
        _write_capacity_records(args.records, subject, config, caps[0], seeds[0])
    return 0


def capacity_warnings(answer: CapacityAnswer) -> list[str]:
    """Why `answer`'s numbers are not a steady state, if they are not."""
    from bench.ruler.short_run import above_bound, too_short
    target = answer.config.target
    checks = [too_short(answer.config.measured)]
    for seed in answer.seeds:
        for warning in (above_bound(seed.capacity_qps, answer.ceiling_target_qps,
                                    f"bound for {target:g} % goodput"),
                        above_bound(seed.fair_capacity_qps, answer.fair_ceiling_qps,
                                    "fair ceiling")):
            checks.append(warning and f"seed {seed.seed}: {warning}")
    return [w for w in checks if w]


def capacity_table(answer: CapacityAnswer) -> str:
    """`capacity`'s answer as a person reads it: one line per seed, the mean, the ceilings."""
    target = answer.config.target
    flag = {s.seed: " !" for s in answer.seeds
            if s.capacity_qps > answer.ceiling_target_qps * 1.0001
            or s.fair_capacity_qps > answer.fair_ceiling_qps * 1.0001}
    lines = [f"capacity of {answer.subject.label} (QPS holding {target:g} % goodput in steady "
             f"state; {answer.config.workload.name} on {answer.config.profile}, "
             f"{answer.config.measured} measured requests per point)",
             f"  {'seed':>6}  {'capacity':>8}  {'fair capacity':>13}  share of the all-served "
             "ceiling"]
    for s in answer.seeds:
        lines.append(f"  {s.seed:>6}  {s.capacity_qps:8.2f}  {s.fair_capacity_qps:13.2f}  "
                     f"{100 * s.capacity_qps / answer.ceiling_qps:5.0f} %{flag.get(s.seed, '')}")
    if len(answer.seeds) > 1:
        lines.append(f"  {'mean':>6}  {answer.mean_qps:8.2f}  {answer.fair_mean_qps:13.2f}  "
                     f"{100 * answer.mean_qps / answer.ceiling_qps:5.0f} %   "
                     f"[{answer.min_qps:.2f}-{answer.max_qps:.2f}]")
    lines.append(f"hardware ceiling: {answer.ceiling_qps:.2f} QPS with every request served; "
                 f"{answer.ceiling_target_qps:.2f} QPS serving the cheapest {target:g} % (a "
                 f"hard bound for this target); {answer.fair_ceiling_qps:.2f} QPS fair")
    lines.append(f"capacity {answer.mean_qps:.2f} QPS = "
                 f"{100 * answer.mean_qps / answer.ceiling_target_qps:.0f} % of the {target:g} % "
                 "bound" + ("" if answer.steady_state else "  (steady_state: false)"))
    lines += [f"WARNING: {w}" for w in answer.warnings]
    return "\n".join(lines)


def readable_config(printable: dict) -> str:
    """The configuration a run used, one line per part (None and empty values left out)."""
    def flat(value, prefix=""):
        if isinstance(value, dict):
            for key, inner in value.items():
                yield from flat(inner, f"{prefix}{key}.")
        elif value not in (None, (), [], ""):
            shown = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
            if isinstance(value, (list, tuple)) and value and isinstance(value[0], dict):
                shown = "; ".join(" ".join(f"{v}" for v in d.values()) for d in value)
            yield f"{prefix[:-1]} {shown}"

    subject, config = printable["subject"], dict(printable["config"])
    config["slo"] = {**config["slo"], "scale": config.pop("slo_scale", None)}
    workload = config["workload"] = dict(config["workload"])
    if workload.get("arrival") != "onoff":
        workload.pop("onoff", None)
    if not workload.get("slo_mix"):
        workload.pop("slo_classes", None)
    if workload.get("tenant_mix"):  # as --tenant-mix takes it
        workload["tenant_mix"] = ",".join(f"{t['tenant']}={t['share']:.4g}:{t['weight']:g}:"
                                          f"{t['priority']}" for t in workload["tenant_mix"])
    tenants = config.pop("tenants", None)
    parts = ["workload", "slo", "controller", "rule"]
    if tenants is not None and (workload.get("tenant_mix")
                                or tenants != msgspec.to_builtins(TenantsConfig())):
        config["tenants"] = tenants
        parts.insert(3, "tenants")
    lines = ["configuration:", "  subject     " + ", ".join(flat(subject))]
    for part in parts:
        lines.append(f"  {part:<11} " + ", ".join(flat(config.pop(part))))
    lines.append("  ruler       " + ", ".join(flat(config)))
    return "\n".join(lines)


def _warn_unbracketed(results: list[SeedCapacity], config: RulerConfig) -> None:
    """Say so loudly when a search never found the edge: its number is no capacity."""
    for r in results:
        if r.bracketed:
            continue
        tried = [p.qps for p in r.points]
        what = (f"every rate tried held, up to {max(tried):.3g} QPS: the capacity is at "
                "least that (raise --start-qps)" if r.capacity_qps > 0 else
                f"no rate tried held, down to {min(tried):.3g} QPS (lower --start-qps, or the "
                "target cannot be met on this workload)")
        print(f"WARNING: seed {r.seed}: {what}", file=sys.stderr)


def _seed_job(job) -> SeedCapacity:
    subject, config, seed, start, growth = job
    result = seed_capacity(subject, config, seed, start, growth)
    for point in result.points:
        worst = min((c for c in point.classes if c.floored), key=lambda c: c.goodput_pct,
                    default=None)
        fairness = (f", worst class {worst.name} {worst.goodput_pct:5.1f}% "
                    f"({'fair' if point.fair_holds else 'unfair'})" if worst else "")
        print(f"  seed {seed} qps {point.qps:7.3f}: goodput {point.goodput_pct:5.1f}% "
              f"{'holds' if point.holds else 'fails'}{fairness}"
              f"{' (stopped early)' if point.stopped_early else ''}", file=sys.stderr)
    return result


def _write_capacity_records(path: str, subject: Subject, config: RulerConfig, qps: float,
                            seed: int) -> None:
    write_records(path, point_rows(subject, config, qps, seed))


def _printable(subject: Subject, config: RulerConfig) -> dict:
    return {"subject": msgspec.to_builtins(subject), "config": msgspec.to_builtins(config)}

