"""The workload flags `simulate`, `capacity` and `bench` share, and the spec they make.

`--workload NAME` (bench/loadgen/workloads.py WORKLOADS; default: `replay` for a trace file with
arrival times, else `poisson`), `--slo-mix`, `--arrival-column`, `--arrival-unit`,
`--rate-scale`, `--max-prompt-len`, `--tenant-mix` (bench/loadgen/tenant_mix.py), and for
the workloads with reuse `--system-prompt-len`, `--turns`, `--think-time`. Each command defines `--trace` and `--burstiness`
itself; `--burstiness B` (not 1) turns Poisson arrivals into gamma ones of shape B, as
`vllm bench serve` does, and is refused for a workload with arrivals of its own kind.
`--qps` on a replayed trace is its target mean rate (the scale is derived from it).
"""
from __future__ import annotations

import argparse

import msgspec

from bench.loadgen.tenant_mix import parse_tenant_mix
from bench.loadgen.trace_file import UNITS
from bench.loadgen.workloads import WORKLOADS, WorkloadSpec, is_timed, parse_slo_mix, workload


def add_workload_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", choices=list(WORKLOADS), default=None,
                   help="arrival pattern: poisson, bursty-cv2/-cv4 (gamma gaps, CV 2/4), onoff "
                        "(ON 10 s at 3x the rate, OFF 30 s at 1/3x), mixed-slo (Poisson with "
                        "SLO classes), system-prompt (a shared 1,000-token system prompt, then "
                        "the trace's prompt), multi-turn (conversations of 5 turns, each "
                        "prompt the history so far), shifting (phases: poisson, mixed-slo with "
                        "a large interactive share, bursty-cv4), replay (the trace file's "
                        "arrival times) (default: replay for a trace file with arrival times, "
                        "else poisson)")
    p.add_argument("--slo-mix", metavar="MIX",
                   help="SLO classes and their shares, e.g. interactive=0.3,standard=0.5,"
                        "batch=0.2 (interactive: TTFT 0.5 s / TBT 0.1 s, standard: 2 s / "
                        "0.15 s, batch: 30 s / 0.5 s); any workload; mixed-slo's default is "
                        "that mix")
    p.add_argument("--arrival-column", metavar="NAME",
                   help="the trace file's column of arrival times (default: the first of "
                        "arrival_time, arrived_at, Timestamp, TIMESTAMP, timestamp, "
                        "timestamp_ms, time it has); a row without it is an error")
    p.add_argument("--arrival-unit", choices=sorted(UNITS),
                   help="unit of numeric arrival times (default: seconds; ms for Mooncake's "
                        "`timestamp` and `timestamp_ms`); ISO dates are read as dates")
    p.add_argument("--rate-scale", type=float, metavar="X",
                   help="replay the trace's times X times as fast (X < 1: slower); instead of "
                        "--qps, which sets the scale that gives that mean rate")
    p.add_argument("--system-prompt-len", type=int, metavar="N",
                   help="system-prompt: tokens of the shared system prompt (default 1000)")
    p.add_argument("--turns", type=int, metavar="T",
                   help="multi-turn: turns per conversation (default 5)")
    p.add_argument("--think-time", type=float, metavar="S",
                   help="multi-turn: mean seconds between a conversation's turns (default 15)")
    p.add_argument("--phase-seconds", metavar="A,B,C",
                   help="shifting: seconds of its poisson, mixed-slo and bursty-cv4 phases "
                        "(default 60,60,60); --slo-mix sets the mixed phase's classes "
                        "(default interactive=0.6,standard=0.3,batch=0.1)")
    p.add_argument("--tenant-mix", metavar="NAME=SHARE[:WEIGHT[:PRIORITY]],...",
                   help="who sends the requests: each arrival draws a tenant by share "
                        "(normalised), e.g. heavy=0.75,light=0.25:2 or chat=0.5,batch=0.5:1:-1; "
                        "WEIGHT is its fair-share weight (default 1; the simulator's "
                        "tenant_weights unless --tenant-weights names it), PRIORITY its "
                        "priority (default 0; < 0: sheddable; -100..100). A live run sends the "
                        "tenant as the x-gateway-inference-fairness-id header. Seeded apart "
                        "from arrivals and lengths: a mix changes only who sends what")
    p.add_argument("--max-prompt-len", type=int, metavar="N",
                   help="trim longer prompts to N tokens (then prompt + output are fitted into "
                        "--max-model-len: the output kept, the prompt cut)")


def workload_spec(args: argparse.Namespace) -> WorkloadSpec:
    """The spec the flags describe (`--trace`, `--burstiness`, `--length-scale` included)."""
    name = args.workload
    if name is None:
        replay = (args.arrival_column is not None or args.rate_scale is not None
                  or is_timed(args.trace))
        name = "replay" if replay else "poisson"
    spec = workload(name, trace=args.trace, arrival_column=args.arrival_column,
                    arrival_unit=args.arrival_unit, rate_scale=args.rate_scale,
                    max_prompt_len=args.max_prompt_len,
                    length_scale=getattr(args, "length_scale", 1.0))
    reuse = {field: value for field in ("system_prompt_len", "turns", "think_time")
             if (value := getattr(args, field, None)) is not None}
    if reuse:
        spec = msgspec.structs.replace(spec, **reuse)
    if getattr(args, "phase_seconds", None):
        try:
            phases = tuple(float(x) for x in args.phase_seconds.split(","))
        except ValueError:
            raise ValueError(f"--phase-seconds {args.phase_seconds!r}: give three numbers, "
                             "e.g. 60,60,60") from None
        spec = msgspec.structs.replace(spec, phase_seconds=phases)
    if getattr(args, "tenant_mix", None):
        spec = msgspec.structs.replace(spec, tenant_mix=parse_tenant_mix(args.tenant_mix))
    if args.slo_mix is not None:
        spec = msgspec.structs.replace(spec, slo_mix=parse_slo_mix(args.slo_mix,
                                                                   spec.slo_classes))
    burstiness = getattr(args, "burstiness", 1.0)
    if burstiness is not None and burstiness != 1.0:
        if spec.arrival != "poisson":
            raise ValueError(f"--burstiness {burstiness:g}: workload {name} has {spec.arrival} "
                             f"arrivals of its own; --burstiness shapes poisson and mixed-slo")
        spec = msgspec.structs.replace(spec, name="gamma" if name == "poisson" else name,
                                       arrival="gamma", burstiness=burstiness)
    return spec
