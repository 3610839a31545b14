"""`ascendra simulate` and `ascendra capacity`: the simulator from the command line."""
from __future__ import annotations

import argparse
import json
import sys

from bench.capacity import find_capacity
from bench.results import print_summary, write_result
from bench.simulate import simulate
from bench.simulator import SimConfig
from daemon.layout import layout_modes
from engines.executors.profiles.registry import profile_names
from engines.scheduler_config import SchedulerConfig


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
    p.add_argument("--json", metavar="OUT", help="write {capacity_qps, points} here")
    p.set_defaults(run=run_capacity)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layout", default="2L1H", help="e.g. 2L1H, 3xsarathi, 3xvllm")
    p.add_argument("--profile", default="a100-llama3-8b", choices=profile_names())
    p.add_argument("--trace", default="sharegpt", help="sharegpt, arxiv, or a CSV/JSONL path")
    p.add_argument("--num-requests", type=int, default=2000)
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


def sim_config(args: argparse.Namespace) -> SimConfig:
    scheduler = SchedulerConfig(chunk_size=args.chunk_size, max_num_seqs=args.max_num_seqs,
                                value_function=args.value_function,
                                offload_threshold=args.offload_threshold,
                                drop_expired=args.drop_expired)
    return SimConfig(layout_modes=tuple(layout_modes(args.layout)), profile=args.profile,
                     scheduler=scheduler, ttft_slo=args.ttft_slo, tbt_slo=args.tbt_slo,
                     max_model_len=args.max_model_len)


def _run_at(args: argparse.Namespace, qps: float):
    return simulate(sim_config(args), trace=args.trace, qps=qps, num_requests=args.num_requests,
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

    capacity, points = find_capacity(run_at, target=args.target, start_qps=args.start_qps)
    answer = {"capacity_qps": capacity, "layout": args.layout, "profile": args.profile,
              "trace": args.trace, "ttft_slo": args.ttft_slo, "tbt_slo": args.tbt_slo,
              "target_pct": args.target, "points": points}
    text = json.dumps(answer, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0
