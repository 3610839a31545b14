"""`ascendra simulate` and `ascendra capacity`: the simulator from the command line."""
from __future__ import annotations

import argparse
import json
import sys

from bench.capacity import find_capacity
from bench.results import print_summary, write_result
from bench.simulate import simulate
from bench.simulator import SimConfig
from bench.traces import TRACE_FILES
from bench.workload import load_rows
from daemon.layout import layout_modes
from engines.executors.profiles.registry import profile_names
from engines.scheduler_config import SchedulerConfig

DEFAULT_NUM_REQUESTS = 2000


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate a layout on a GPU profile (virtual clock)")
    _add_common(p)
    p.add_argument("--qps", type=float, required=True, help="arrival rate, requests/s")
    p.add_argument("--json", metavar="OUT", help="write the result JSON here")
    p.set_defaults(run=run_simulate)
    p = sub.add_parser("capacity", help="highest QPS with goodput >= --target, by simulation")
    _add_common(p)
    p.add_argument("--target", type=float, default=90.0, help="goodput %% to hold (default 90)")
    p.add_argument("--start-qps", type=float, default=1.0)
    p.add_argument("--tolerance", type=float, default=0.03,
                   help="stop once the bracket is this narrow, relative (default 0.03)")
    p.add_argument("--max-runs", type=int, default=16, help="simulations at most (default 16)")
    p.add_argument("--json", metavar="OUT", help="write {capacity_qps, points} here")
    p.set_defaults(run=run_capacity)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layout", default="2L1H", help="e.g. 2L1H, 3xsarathi, 3xvllm")
    p.add_argument("--profile", default="a100-llama3-8b", choices=profile_names())
    p.add_argument("--trace", default="sharegpt", help="sharegpt, arxiv, or a CSV/JSONL path")
    p.add_argument("--num-requests", type=int, default=None,
                   help=f"requests to simulate (default {DEFAULT_NUM_REQUESTS}, or every row of a "
                        "trace file with arrival times)")
    p.add_argument("--ttft-slo", type=float, default=1.0)
    p.add_argument("--tbt-slo", type=float, default=0.15)
    p.add_argument("--burstiness", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chunk-size", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--value-function", default="edf", choices=["edf", "sjf", "ljf", "fcfs"])
    p.add_argument("--offload-threshold", type=float, default=1.0)
    p.add_argument("--drop-expired", action="store_true")
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--sim-latency", default="",
                   help="step latency as `serve --sim-latency` takes it (constant:0.05, ...); "
                        "default: the profile's step times")
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help="KV blocks per instance (default: what the profile's GPU holds)")


def sim_config(args: argparse.Namespace) -> SimConfig:
    scheduler = SchedulerConfig(chunk_size=args.chunk_size, max_num_seqs=args.max_num_seqs,
                                value_function=args.value_function,
                                offload_threshold=args.offload_threshold,
                                drop_expired=args.drop_expired)
    return SimConfig(layout_modes=tuple(layout_modes(args.layout)), profile=args.profile,
                     scheduler=scheduler, ttft_slo=args.ttft_slo, tbt_slo=args.tbt_slo,
                     max_model_len=args.max_model_len, latency=args.sim_latency,
                     num_kv_blocks=args.num_kv_blocks)


def num_requests(args: argparse.Namespace) -> int:
    """--num-requests; unset: every row of a trace file that gives arrival times (it is
    replayed as it stands), else DEFAULT_NUM_REQUESTS."""
    if args.num_requests is not None:
        if args.num_requests < 1:
            raise ValueError(f"--num-requests must be >= 1, got {args.num_requests}")
        return args.num_requests
    if args.trace not in TRACE_FILES:
        rows = load_rows(args.trace)
        if all(row.arrival is not None for row in rows):
            return len(rows)
    return DEFAULT_NUM_REQUESTS


def _run_at(args: argparse.Namespace, qps: float):
    return simulate(sim_config(args), trace=args.trace, qps=qps, num_requests=num_requests(args),
                    seed=args.seed, burstiness=args.burstiness, config={"layout": args.layout})


def run_simulate(args: argparse.Namespace) -> int:
    result = _run_at(args, args.qps)
    print_summary(result)
    if args.json:
        write_result(result, args.json)
    return 0


def run_capacity(args: argparse.Namespace) -> int:
    def run_at(qps: float):
        result = _run_at(args, qps)
        print(f"  qps {qps:7.3f}: goodput {result.goodput_pct:5.1f}%", file=sys.stderr)
        return result

    capacity, points = find_capacity(run_at, target=args.target, start_qps=args.start_qps,
                                     tolerance=args.tolerance, max_runs=args.max_runs)
    answer = {"capacity_qps": capacity, "layout": args.layout, "profile": args.profile,
              "trace": args.trace, "ttft_slo": args.ttft_slo, "tbt_slo": args.tbt_slo,
              "target_pct": args.target, "tolerance": args.tolerance, "points": points}
    text = json.dumps(answer, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0
