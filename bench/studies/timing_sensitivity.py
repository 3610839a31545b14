"""How far one run's goodput moves when only its timing moves: the resolution of a
live-vs-simulated comparison (bench/studies/live_check.py).

The same requests are simulated several times, each with another delay for one message
between the controller and an instance (SimConfig.ipc_delay: the simulator's default 0.5 ms,
and the delays a live daemon's ZeroMQ hops see around it). Nothing else changes: the
requests, the scheduler, the step times. Where a run sits on an edge -- a queue that
grows for the whole run, preemptions that depend on which step a block runs out in -- a
fraction of a millisecond moves goodput by as much as the live daemon differs from the
simulator, and the live check can only be read over seeds.

    python -m bench.studies.timing_sensitivity --layout 3xvllm-v1 --chunk-size 8192 \\
        --drop-expired --workload poisson --qps 13.6 --num-requests 1500 --seeds 0,1,2 \\
        [--ipc-delays 0.00025,0.0005,0.001] [--json OUT]

It takes the simulator's flags (`ascendra simulate`'s); per seed it prints goodput and
preemptions per instance at each delay, and the spread (max - min) of goodput.
"""
from __future__ import annotations

import argparse
import dataclasses

import msgspec

from bench.json_file import write_json
from bench.loadgen.workloads import build_requests
from bench.ruler.ruler import sim_config
from bench.sim.sim_flags import add_sim_flags, sim_settings
from bench.sim.box_run import simulate

DEFAULT_IPC_DELAYS = (0.00025, 0.0005, 0.001)


class DelayRun(msgspec.Struct, frozen=True):
    ipc_delay_s: float
    goodput_pct: float
    dropped: int
    preemptions: list[int]


class SeedSensitivity(msgspec.Struct, frozen=True):
    seed: int
    runs: list[DelayRun]
    #: max - min goodput over the delays, percentage points
    spread_points: float


def seed_sensitivity(args: argparse.Namespace, seed: int,
                     delays: tuple[float, ...]) -> SeedSensitivity:
    subject, config = sim_settings(args)
    requests = build_requests(config.workload, rate=args.qps, num_requests=args.num_requests,
                              seed=seed, max_model_len=config.max_model_len)
    runs = []
    for delay in delays:
        sim = dataclasses.replace(sim_config(subject, config), ipc_delay=delay)
        result = simulate(sim, requests, seed=seed)
        runs.append(DelayRun(delay, result.goodput_pct, result.dropped,
                             [i["preemptions"] for i in result.per_instance]))
    goodputs = [r.goodput_pct for r in runs]
    return SeedSensitivity(seed, runs, round(max(goodputs) - min(goodputs), 2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.timing_sensitivity",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sim_flags(parser)
    parser.add_argument("--qps", type=float, required=True)
    parser.add_argument("--num-requests", type=int, default=1500)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--ipc-delays", default=",".join(f"{d:g}" for d in DEFAULT_IPC_DELAYS),
                        help="seconds per controller <-> instance message (default %(default)s)")
    parser.add_argument("--json", help="write the table here")
    args = parser.parse_args(argv)
    delays = tuple(float(d) for d in args.ipc_delays.split(","))
    if not all(d >= 0 for d in delays):
        parser.error(f"--ipc-delays: every delay must be >= 0 seconds, got {args.ipc_delays}")
    seeds = [int(s) for s in args.seeds.split(",")]
    results = []
    for seed in seeds:
        result = seed_sensitivity(args, seed, delays)
        results.append(result)
        for run in result.runs:
            print(f"seed {seed} ipc delay {1000 * run.ipc_delay_s:.2f} ms: goodput "
                  f"{run.goodput_pct:.1f} %, dropped {run.dropped}, preemptions "
                  f"{run.preemptions}", flush=True)
        print(f"seed {seed}: spread {result.spread_points:.1f} points", flush=True)
    if args.json:
        write_json(args.json, {"layout": args.layout, "workload": args.workload, "qps": args.qps,
                               "num_requests": args.num_requests, "seeds": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
