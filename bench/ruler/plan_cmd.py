"""`ascendra plan`: the recommended split of N GPUs for a workload, by simulation."""
from __future__ import annotations

import argparse
import sys

import msgspec

from bench.json_file import write_json
from bench.parallel import add_workers_flag
from bench.sim.sim_flags import add_fair_floor_flag, add_sim_flags, sim_settings

DEFAULT_MEASURED = 2000
#: `--quick`'s measured requests per point: with its searches (bench/ruler/plan.py
#: QUICK_STEPS), a plan of up to 4 GPUs in about two minutes of two cores.
QUICK_MEASURED = 400


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_sim_flags(p, layout=False)
    p.add_argument("--gpus", type=int, default=3,
                   help="GPUs, one instance each (with --tp k: k each) (default 3)")
    p.set_defaults(tp=None)
    p.add_argument("--search-tp", dest="tp", action="store_const", const=0,
                   help="search every tensor-parallel degree (1, 2, 4, 8) that divides --gpus "
                        "and fits the model, with the role layouts and baselines at each "
                        "(default: only when the model does not fit one GPU, as a 70B; "
                        "--tp k plans at k only)")
    p.add_argument("--measured", type=int, default=None,
                   help="measured requests per simulated point (default 2000; the "
                        "capacity table's ruler uses 4500)")
    p.add_argument("--quick", action="store_true",
                   help=f"a first look in about two minutes: {QUICK_MEASURED} measured "
                        "requests per point, searches in steps of 2x to 20 %% (not a steady "
                        "state: the answer says so)")
    p.add_argument("--model-mix", metavar="A=0.8,B=0.2", default=None,
                   help="plan the placement of several models (MuxServe): dedicated GPUs per "
                        "model, every GPU multiplexing them, or vLLM V1 dedicated, by each "
                        "one's capacity with every model at 90 %% goodput (a reduced "
                        "protocol: --measured requests a run, default 600)")
    p.add_argument("--model-profile", metavar="A=PROFILE,...", default=None,
                   help="with --model-mix: each model's GPU profile (default: --profile)")
    add_fair_floor_flag(p)
    add_workers_flag(p)
    p.add_argument("--json", metavar="OUT", help="write the answer here")
    p.set_defaults(run=run)


class LayoutBar:
    """A line per layout as its search ends, on stderr, under a bar of the layouts done
    (tqdm's on a terminal when tqdm is installed; the lines count `[k/n]` anyway)."""

    def __init__(self, total: int) -> None:
        self._bar = None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, desc="layouts", unit="layout", file=sys.stderr,
                             dynamic_ncols=True)

    def done(self, line: str) -> None:
        if self._bar is None:
            print(line, file=sys.stderr, flush=True)
            return
        self._bar.write(line, file=sys.stderr)
        self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def run(args: argparse.Namespace) -> int:
    if args.model_mix is not None:
        return _run_mix(args)
    from bench.ruler.plan import candidate_layouts, plan
    from bench.ruler.plan_tp import fitting_degrees
    if args.tp is None:  # search the degrees when the model does not fit one GPU
        args.tp = 0 if "@tp" not in args.profile and fitting_degrees(args.profile, 1)[0][1] else 1
    _, config = sim_settings(args)
    measured = args.measured or (QUICK_MEASURED if args.quick else DEFAULT_MEASURED)
    config = msgspec.structs.replace(config, measured=measured, seeds=(args.seed,),
                                     fair_floor=args.fair_floor)
    if args.tp == 0 and "@tp" not in args.profile:
        return _run_degrees(args, config)
    gpus = args.gpus // max(args.tp, 1)
    bar = LayoutBar(len(candidate_layouts(gpus)))
    try:
        answer = plan(config, gpus, workers=args.workers, quick=args.quick,
                      progress=lambda line: print(line, file=sys.stderr),
                      layout_done=bar.done)
    finally:
        bar.close()
    _print(args, config, answer)
    if args.json:
        write_json(args.json, answer)
    return 0


def _run_mix(args) -> int:
    from bench.ruler.model_mix import MixRun, parse_mix
    from bench.ruler.plan_mix import plan_mix
    subject, config = sim_settings(args)
    try:
        mix = parse_mix(args.model_mix)
        profiles = _model_profiles(args.model_profile, mix, args.profile)
    except ValueError as exc:
        print(f"ascendra plan: error: {exc}", file=sys.stderr)
        return 2
    run = MixRun(mix=tuple(mix.items()), profiles=tuple(profiles.items()), seed=args.seed,
                 num_requests=args.measured or 600, scheduler=subject.scheduler,
                 slo=config.slo, workload=config.workload)
    answer = plan_mix(args.gpus, run, workers=args.workers,
                      progress=lambda line: print(line, file=sys.stderr))
    width = max(len(c.placement) for c in answer.candidates)
    print(f"{answer.num_gpus} GPUs, mix "
          + ", ".join(f"{m} {100 * s:.0f} % ({profiles[m]})" for m, s in mix.items())
          + f"; capacity = every model at 90 % goodput ({answer.protocol}), in QPS:")
    for c in sorted(answer.candidates, key=lambda c: -c.capacity_qps):
        mark = "  <- recommended" if c.placement == answer.recommended else ""
        at = "  ".join(f"{m} {v['goodput_pct']} %" for m, v in (c.at_capacity or {}).items())
        print(f"  {c.placement:>{width}}  {c.capacity_qps:6.2f}  {at}{mark}")
    if args.json:
        write_json(args.json, answer)
    return 0


def _model_profiles(text: str | None, mix: dict[str, float], default: str) -> dict[str, str]:
    given = {}
    for item in filter(None, (x.strip() for x in (text or "").split(","))):
        name, equals, profile = item.partition("=")
        if not equals or name.strip() not in mix:
            raise ValueError(f"--model-profile: {item!r} is not NAME=PROFILE for a model of "
                             f"--model-mix ({', '.join(mix)})")
        given[name.strip()] = profile.strip()
    return {m: given.get(m, default) for m in mix}


def _run_degrees(args, config) -> int:
    from bench.ruler.plan_tp import plan_degrees
    answer = plan_degrees(config, args.gpus, workers=args.workers,
                          progress=lambda line: print(line, file=sys.stderr))
    for degree in answer.degrees:
        if degree.answer is None:
            print(f"tp {degree.tp} ({degree.instances} instances): not planned: {degree.skipped}")
            continue
        print(f"tp {degree.tp} ({degree.instances} instances of {degree.tp} GPUs):")
        _print(args, degree.answer.config, degree.answer)
    print(f"recommended: {answer.recommended} at tp {answer.recommended_tp}: {answer.why}")
    if args.json:
        write_json(args.json, answer)
    return 0


def _print(args, config, answer) -> None:
    from bench.ruler.short_run import too_short
    width = max(len(c.layout) for c in answer.candidates)
    print(f"{answer.num_gpus} instances, workload {config.workload.name} on {config.profile}: hardware "
          f"ceiling {answer.ceiling_qps:.2f} QPS (all served), {answer.ceiling_target_qps:.2f} "
          f"QPS (the cheapest {config.target:g} %), {answer.fair_ceiling_qps:.2f} QPS (fair: "
          f"every prompt-length class >= {100 * config.fair_floor:g} %)")
    print(f"SLOs: TTFT {config.slo.ttft_slo:g} s, TBT {config.slo.tbt_slo:g} s; "
          + config.slo_scale.describe())
    print(f"ranked by fair capacity (every prompt-length class >= {100 * config.fair_floor:g} "
          f"%), then capacity ({config.target:g} % of requests in their targets), in QPS:")
    print(f"  {'layout':>{width}}  capacity  fair capacity")
    for c in sorted(answer.candidates, key=lambda c: (-c.fair_capacity_qps, -c.capacity_qps)):
        mark = "  <- recommended" if c.layout == answer.recommended else ""
        note = f"  ({c.note})" if c.note else ""
        warning = f"  WARNING: {'; '.join(c.warnings)}" if c.warnings else ""
        print(f"  {c.layout:>{width}}  {c.capacity_qps:8.2f}  {c.fair_capacity_qps:13.2f}  "
              f"({100 * c.fraction_of_ceiling:.0f} % of the all-served ceiling){mark}{note}"
              f"{warning}")
    short = too_short(config.measured)
    if short:
        print(f"WARNING: {short}: a first look, not a steady state (steady_state: false)")
