"""How long the LP's per-step policy work takes with a long waiting queue (no engine).

Each engine step an LP instance orders its waiting queue by value and plans offloads
over it. This times, on 2,000 waiting requests:

* the per-request reference functions (`order_by_value`, `plan_offloads`) with a cheap
  linear predictor asked directly and through `MemoPredictor`, with a per-layer stand-in
  for an analytic model's cost, and with the fitted `PerfModel` itself;
* what the engine runs instead (`columns ...` rows): the same decisions over the queue's
  columns (`policies.queue_columns`), built once as the engine's waiting queue keeps them;
* the controller's global-queue plan (policies/global_queue.py) over the most requests
  one pass looks at (`HORIZON`).

Prints figures; it does not pass or fail. `--compare DIR` runs the same bench on another
checkout too (rows it lacks print as -) and prints both side by side; `--clock cpu` times
the thread's CPU time (steadier on a busy machine).

    python -m bench.micro.policy_latency [--waiting 2000] [--iters 200] [--clock wall|cpu]
                                   [--compare DIR]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from bench.micro.side_by_side import CLOCKS, run_elsewhere
from engines.request import Request
from ipc.params import SamplingParams
from policies.global_queue import Lane, Shed, Waiting, plan as plan_queue
from policies.offload import plan_offloads
from policies.predictor import LinearPredictor, MemoPredictor, Predictor
from policies.value import edf, order_by_value, slack

TOKEN_BUDGET = 512
NOW = 1.0
NEXT_BATCH_TIME, THRESHOLD, IPC_DELAY = 0.05, 1.0, 0.002
#: The clock the bench reads (`--clock`; bench/micro/side_by_side.py).
clock = CLOCKS["wall"]


class PerLayerPredictor(LinearPredictor):
    """A stand-in for an analytic model's cost: it sums a term per layer (32 layers)
    on each question, as a FLOPs/bytes model does. Same answers as LinearPredictor."""

    def prefill_time(self, num_tokens: int, already: int = 0,
                     token_budget: int | None = None) -> float:
        per_layer = super().prefill_time(num_tokens, already, token_budget) / 32
        return sum(per_layer for _ in range(32))


def waiting_queue(n: int, seed: int = 0) -> list[Request]:
    """`n` prompts of 16..2048 tokens that arrived over the last second, TTFT SLO 1 s."""
    rng = random.Random(seed)
    sampling = SamplingParams(max_tokens=256)
    requests = []
    for i in range(n):
        arrival = rng.uniform(0.0, 1.0)
        requests.append(Request(f"w{i}", [1] * rng.randrange(16, 2048), sampling,
                                arrival_time=arrival, deadline=arrival + 1.0))
    return requests


def time_calls(fn: Callable[[], object], iters: int) -> dict[str, float]:
    times = []
    for _ in range(iters):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    times.sort()
    return {"mean": statistics.fmean(times) * 1e3, "p50": times[len(times) // 2] * 1e3,
            "p99": times[int(len(times) * 0.99)] * 1e3}


def bench(predictor: Predictor, waiting: list[Request], iters: int) -> dict[str, dict]:
    def order(value_fn=edf) -> list:
        return order_by_value(waiting, NOW, value_fn, predictor, TOKEN_BUDGET)

    def offloads(ordered: list) -> object:
        return plan_offloads(ordered, NOW, predictor=predictor, token_budget=TOKEN_BUDGET,
                             next_batch_time=NEXT_BATCH_TIME, threshold=THRESHOLD,
                             ipc_delay=IPC_DELAY)

    ordered = order()
    rows = {"order_by_value (edf)": time_calls(order, iters),
            "order_by_value (slack)": time_calls(lambda: order(slack), iters),
            "plan_offloads": time_calls(lambda: offloads(ordered), iters),
            "order_by_value + plan_offloads": time_calls(lambda: offloads(order()), iters)}
    rows.update(bench_columns(predictor, waiting, iters))
    return rows


def bench_columns(predictor: Predictor, waiting: list[Request], iters: int) -> dict[str, dict]:
    """The engine's path: value order and offloads over the queue's columns."""
    try:
        from policies.offload import offload_candidates, offload_rows
        from policies.queue_columns import QueueColumns
        from policies.value import VALUE_KEYS, value_order
    except ImportError:  # a checkout from before the columns
        return {}
    columns = QueueColumns.of(waiting, predictor, TOKEN_BUDGET)
    full_batch = predictor.full_batch_time(TOKEN_BUDGET)

    def order(value: str = "edf"):
        return value_order(columns, NOW, VALUE_KEYS[value], demote_unreachable=False)

    def offloads(order_) -> list[int]:
        candidates = offload_candidates(columns, order_, NOW, full_batch=full_batch,
                                        threshold=THRESHOLD, ipc_delay=IPC_DELAY)
        return offload_rows(columns, order_, candidates, NOW,
                            next_batch_time=lambda: NEXT_BATCH_TIME, full_batch=full_batch,
                            threshold=THRESHOLD, ipc_delay=IPC_DELAY)

    ordered = order()
    return {"columns value_order (edf)": time_calls(order, iters),
            "columns value_order (slack)": time_calls(lambda: order("slack"), iters),
            "columns offloads": time_calls(lambda: offloads(ordered), iters),
            "columns value_order + offloads": time_calls(lambda: offloads(order()), iters)}


def bench_global_queue(n: int, iters: int) -> dict[str, dict]:
    """One plan of the controller's queue: `n` requests, two LPs, one HP, all behind."""
    rng = random.Random(1)
    queue = []
    for i in range(n):
        arrival, cost = rng.uniform(0.0, 1.0), rng.uniform(0.002, 0.3)
        queue.append(Waiting(f"w{i}", arrival, arrival + 1.0, cost, cost))
    lps, hps = [Lane(0, 0.3), Lane(1, 0.5)], [Lane(2, 0.2)]
    return {f"global_queue.plan ({shed.value})": time_calls(
        lambda: plan_queue(queue, lps, hps, 1.0, 0.4, shed), iters)
        for shed in (Shed.DROP, Shed.DEMOTE)}


def perf_model_predictor() -> Predictor:
    """The fitted model the simulator's LP instances use (a100-llama3-8b profile)."""
    from engines.executors.profiles.registry import get_profile
    from engines.perf_setup import profile_perf_model
    from engines.scheduler_config import SchedulerConfig
    config = SchedulerConfig(mode="lp", chunk_size=TOKEN_BUDGET)
    return profile_perf_model(get_profile("a100-llama3-8b"), config, 8192, 8192 * 64)


def measure(waiting_count: int, iters: int) -> dict[str, dict[str, dict]]:
    from daemon.core.waiting_room import HORIZON
    waiting = waiting_queue(waiting_count)
    linear = LinearPredictor(seconds_per_token=1e-4, fixed=0.01)
    per_layer = PerLayerPredictor(seconds_per_token=1e-4, fixed=0.01)
    perf = perf_model_predictor()
    sections = {
        "LinearPredictor": bench(linear, waiting, iters),
        "MemoPredictor(LinearPredictor), warm": bench(MemoPredictor(linear), waiting, iters),
        "PerLayerPredictor": bench(per_layer, waiting, max(1, iters // 10)),
        "MemoPredictor(PerLayerPredictor), warm": bench(MemoPredictor(per_layer), waiting, iters),
        "MemoPredictor(PerfModel), warm": bench(MemoPredictor(perf), waiting, iters),
        f"controller global queue, {HORIZON} waiting": bench_global_queue(HORIZON, iters),
    }
    # asked directly, each question was a numpy call before the model remembered its rows
    sections["PerfModel"] = bench(perf, waiting, max(1, iters // 20))
    return sections



def _print(sections: dict, other: dict | None) -> None:
    for section, rows in sections.items():
        print(f"{section}:")
        for label, row in rows.items():
            line = f"  {label:32s} mean {row['mean']:6.2f} ms  p50 {row['p50']:6.2f} ms  " \
                   f"p99 {row['p99']:6.2f} ms"
            if other is not None:
                was = other.get(section, {}).get(label)
                line += (f"   | other: p50 {was['p50']:6.2f} ms  x{was['p50'] / row['p50']:.1f}"
                         if was else "   | other: -")
            print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", type=int, default=2000)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--compare", type=Path, metavar="DIR",
                        help="another checkout to time the same way, side by side")
    parser.add_argument("--emit-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    sections = measure(args.waiting, args.iters)
    if args.emit_json:
        json.dump(sections, sys.stdout)
        return
    flags = ["--waiting", str(args.waiting), "--iters", str(args.iters), "--clock", args.clock]
    other = run_elsewhere(__file__, args.compare, flags) if args.compare else None
    print(f"{args.waiting} waiting requests, token budget {TOKEN_BUDGET}, {args.iters} calls each, "
          f"{args.clock} time"
          + (f"; 'other' = {args.compare}" if args.compare else ""))
    _print(sections, other)


if __name__ == "__main__":
    main()
