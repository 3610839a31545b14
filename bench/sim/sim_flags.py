"""The flags `simulate`, `capacity` and `plan` share, and the settings they make.

The scheduler, SLO, controller and tenants settings come from the same structs and flags as
`serve`'s (daemon/config.py `add_config_flags`), so a simulated box has the daemon's
defaults unless told otherwise; the workload flags are bench/loadgen/workload_flags.py's.
"""
from __future__ import annotations

import argparse

import msgspec

from bench.loadgen.workload_flags import add_workload_flags, workload_spec
from bench.loadgen.workloads import SloClass, WorkloadSpec
from bench.ruler.ruler import NEAR_GROWTH, START_GROWTH, RulerConfig, Subject
from daemon.config import FLAT, SIMULATOR_SECTIONS, add_config_flags, load_config
from daemon.slo_defaults import DEFAULT_SLO_SCALE, SLO_SCALE_HELP, scaled_slo
from daemon.layout import layout_modes
from engines.executors.profiles.registry import get_profile, profile_names, with_tp
from engines.executors.profiles.slo_scale import SloScale, parse_slo_scale


def add_sim_flags(p: argparse.ArgumentParser, layout: bool = True) -> None:
    """The flags of a simulated box: its layout (unless the command chooses it), profile,
    workload, and the scheduler, SLO, controller and tenants settings `serve` takes (a
    `--tenant-mix`'s weights are the tenants' unless `--tenant-weights` names them)."""
    if layout:
        p.add_argument("--layout", default="2L1H", help="e.g. 2L1H, 3xsarathi, 3xvllm-v1, 3xsglang")
    p.add_argument("--profile", default="a100-llama3-8b", type=profile_argument,
                   help=f"a GPU profile: one of {', '.join(profile_names())} (over k GPUs: "
                        "<name>@tp<k> or --tp k), or a file `ascendra profile` measured "
                        "(default: %(default)s)")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel degree of every instance (2, 4, 8): the profile's "
                        "step times and memory over that many GPUs (default %(default)s)")
    p.add_argument("--slo-scale", default=DEFAULT_SLO_SCALE, metavar="auto|X|TTFT,TBT",
                   help=f"{SLO_SCALE_HELP} (default %(default)s; `serve --slo-scale` the same "
                        "for its sim executor's profile)")
    p.add_argument("--trace", default="sharegpt",
                   help="sharegpt, arxiv, azure-conv (with arrival times), or a CSV/JSONL path")
    p.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the gaps: 1 = Poisson, < 1 burstier (default 1)")
    add_workload_flags(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=RulerConfig().max_model_len)
    p.add_argument("--sim-latency", default="",
                   help="step latency as `serve --sim-latency` takes it (constant:0.05, ...); "
                        "default: the profile's step times")
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help="KV blocks per instance (default: what the profile's GPU holds)")
    add_config_flags(p, SIMULATOR_SECTIONS)


def profile_argument(value: str) -> str:
    """`--profile`'s type: a built-in name or a readable profile file."""
    try:
        get_profile(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def sim_settings(args: argparse.Namespace) -> tuple[Subject, RulerConfig]:
    """The run's layout and every setting it depends on, from the flags."""
    shared = load_config(overrides={"executor": "sim"} | {
        name: getattr(args, name, None) for name, section in FLAT.items()
        if section in SIMULATOR_SECTIONS})   # a simulated box's instances are sim executors
    layout = getattr(args, "layout", "2L1H")
    layout_modes(layout)  # a bad layout is an error now, naming it
    subject = Subject(label=layout, layout=layout, scheduler=shared.scheduler)
    profile = sim_profile(args.profile, getattr(args, "tp", 1) or 1)
    scale = parse_slo_scale(getattr(args, "slo_scale", DEFAULT_SLO_SCALE), profile)
    given = {name for name in ("ttft_slo", "tbt_slo") if getattr(args, name, None) is not None}
    config = RulerConfig(workload=scaled_classes(workload_spec(args), scale),
                         profile=profile, slo=scaled_slo(shared.slo, scale, given),
                         slo_scale=scale, controller=shared.controller, tenants=shared.tenants,
                         max_model_len=args.max_model_len,
                         latency=args.sim_latency, num_kv_blocks=args.num_kv_blocks)
    return subject, config


def on_profile(config: RulerConfig, profile: str,
               max_model_len: int | None = None) -> RulerConfig:
    """`config` on `profile` at that profile's own SLOs (`--slo-scale auto`: the targets
    and the workload's SLO classes times its scale; 1 for a model on one GPU and for a
    measured file), and at `max_model_len` when given: what a study's `--profile` does."""
    scale = parse_slo_scale(DEFAULT_SLO_SCALE, profile)
    return msgspec.structs.replace(
        config, profile=profile, slo=scaled_slo(config.slo, scale, set()),
        workload=scaled_classes(config.workload, scale), slo_scale=scale,
        max_model_len=max_model_len or config.max_model_len)


def scaled_classes(spec: WorkloadSpec, scale: SloScale) -> WorkloadSpec:
    """`spec` with every SLO class's targets times `scale`."""
    if (scale.ttft, scale.tbt) == (1.0, 1.0):
        return spec
    classes = tuple(SloClass(c.name, round(c.ttft_slo * scale.ttft, 6),
                             round(c.tbt_slo * scale.tbt, 6)) for c in spec.slo_classes)
    return msgspec.structs.replace(spec, slo_classes=classes)


def sim_profile(name: str, tp: int = 1) -> str:
    """The profile's name at degree `tp` (`<name>@tp<k>`); ValueError naming the profile or
    tp when there is no such profile or no data at that degree."""
    full = with_tp(name, tp)
    get_profile(full, tp)
    return full


def add_start_growth_flag(p: argparse.ArgumentParser) -> None:
    """How far a capacity search steps from its start until it brackets the edge."""
    p.add_argument("--start-growth", type=float, default=START_GROWTH,
                   help="the search's step up or down from its start until it brackets the "
                        f"edge (default %(default)s; {NEAR_GROWTH} from a --start-qps near "
                        "the answer: fewer runs)")


def add_fair_floor_flag(p: argparse.ArgumentParser) -> None:
    """The ruler's fair floor, for the commands that search a capacity."""
    p.add_argument("--fair-floor", type=float, default=RulerConfig().fair_floor,
                   help="fair capacity: every request class (prompt-length quartile, SLO "
                        "class) must reach this goodput share too; 0 = no floor "
                        "(default %(default)s)")
