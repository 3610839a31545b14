"""`ascendra simulate --boxes B`: a fleet of simulated boxes behind a gateway model.

The fleet flags (defaults from `bench.sim.fleet.GatewayConfig`, the EPP's), what they make,
and the printout: the fleet's steady-state goodput and each box's share of the work and
goodput. `--qps` and `--num-requests` are the fleet's totals, at the gateway.
"""
from __future__ import annotations

import argparse
import sys

import msgspec

from bench.json_file import write_json
from bench.loadgen.workloads import num_requests_or
from bench.ruler.ruler import RulerConfig, Subject
from bench.sim.fleet import GatewayConfig
from bench.sim.fleet_run import FleetResult, run_fleet
from daemon.layout import layout_modes
from bench.sim.endpoint_picker import Picker


def add_fleet_flags(p: argparse.ArgumentParser) -> None:
    defaults = GatewayConfig()
    p.add_argument("--boxes", type=int, default=None,
                   help="simulate B boxes behind an inference gateway (default 1: one box, no "
                        "gateway); --qps and --num-requests are then the fleet's totals")
    p.add_argument("--box-layouts", metavar="L1,L2,...",
                   help="the boxes' layouts, cycled over --boxes (default: --layout for every "
                        "box), e.g. 2L1H,3xsarathi")
    p.add_argument("--picker", choices=[k.value for k in Picker], default=defaults.picker.value,
                   help="how the gateway picks a box: epp (the Inference Extension's default "
                        "queue + KV-cache scorers), least_queue, round_robin "
                        "(default %(default)s)")
    p.add_argument("--refresh-interval", type=float, default=defaults.refresh_interval,
                   help="seconds between the gateway's scrapes of the boxes' metrics; 0 = a "
                        "fresh view at every pick (default %(default)s, the EPP's)")


def is_fleet(args: argparse.Namespace) -> bool:
    return (args.boxes is not None and args.boxes != 1) or bool(args.box_layouts)


def box_subjects(args: argparse.Namespace, subject: Subject) -> list[Subject]:
    """One subject per box: the listed layouts cycled over the boxes, each at the run's
    scheduler settings."""
    layouts = [s.strip() for s in (args.box_layouts or subject.layout).split(",") if s.strip()]
    boxes = args.boxes if args.boxes is not None else len(layouts)
    if boxes < 1:
        raise ValueError(f"--boxes must be >= 1, got {boxes}")
    for layout in layouts:
        layout_modes(layout)  # a bad layout is an error now, naming it
    return [Subject(label=layouts[b % len(layouts)], layout=layouts[b % len(layouts)],
                    scheduler=subject.scheduler) for b in range(boxes)]


def run_fleet_simulate(args: argparse.Namespace, subject: Subject, config: RulerConfig,
                       default_per_box: int) -> int:
    if args.records:
        raise ValueError("--records writes one box's requests; it does not take --boxes")
    if args.qps is None:
        raise ValueError("--qps (the fleet's total arrival rate) is needed with --boxes")
    subjects = box_subjects(args, subject)
    gateway = GatewayConfig(picker=Picker(args.picker), refresh_interval=args.refresh_interval)
    n = args.num_requests if args.num_requests is not None else num_requests_or(
        config.workload, default_per_box * len(subjects))
    if n < 1:
        raise ValueError(f"--num-requests must be >= 1, got {n}")
    print("fleet of", msgspec.json.encode(fleet_settings(
        subjects, config, gateway, args.qps, n, args.seed)).decode(), file=sys.stderr)
    result = run_fleet(subjects, config, gateway, args.qps, n, args.seed)
    print_fleet(result)
    if args.json:
        write_json(args.json, result)
    return 0


def fleet_settings(subjects: list[Subject], config: RulerConfig, gateway: GatewayConfig,
                   qps: float, num_requests: int, seed: int) -> dict:
    """What a fleet run uses, and only that (not the capacity ruler's seeds, measured
    count or search settings, which a single run does not read)."""
    return {"boxes": [s.layout for s in subjects], "gateway": gateway,
            "scheduler": subjects[0].scheduler, "qps": qps, "num_requests": num_requests,
            "seed": seed, "workload": config.workload, "profile": config.profile,
            "slo": config.slo, "controller": config.controller,
            "max_model_len": config.max_model_len, "target": config.target,
            "rule": config.rule}


def print_fleet(result: FleetResult) -> None:
    print(f"fleet: {len(result.boxes)} boxes, picker {result.gateway.picker.value} "
          f"(view every {result.gateway.refresh_interval:g} s, mean age "
          f"{1000 * result.mean_view_age_s:.1f} ms), {result.qps:g} QPS, "
          f"{result.num_requests} requests, seed {result.seed}")
    print(f"  goodput {result.goodput_pct:.1f}% ({result.goodput_rps:.2f} req/s within SLO), "
          f"windows {', '.join(f'{w:.1f}' for w in result.window_goodput_pct)}: "
          f"{'holds' if result.holds else 'fails'} the target")
    print(f"  {'box':>4} {'layout':>10} {'requests':>9} {'share':>7} {'goodput':>8} "
          f"{'dropped':>8} {'offloaded':>10}  seen: waiting, running, KV use")
    for b in result.boxes:
        print(f"  {b.box:>4} {b.layout:>10} {b.requests:>9} {b.share_pct:>6.1f}% "
              f"{b.goodput_pct:>7.1f}% {b.dropped:>8} {b.offloaded:>10}  {b.seen_waiting:6.1f} "
              f"{b.seen_running:6.1f} {100 * b.seen_kv_usage:5.1f}%")
