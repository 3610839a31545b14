"""How long the LP's per-step policy work takes with a long waiting queue (no model).

Each engine step an LP instance orders its waiting queue by value (EDF) and plans
offloads over it. This times both on 2,000 waiting requests, with a cheap linear
predictor asked directly and through `MemoPredictor` (what a costly fitted model
would be wrapped in), and with a per-layer stand-in for an analytic model's cost
asked directly and memoized. It also times the controller's global-queue plan
(policies/global_queue.py) over the most requests one pass looks at (`HORIZON`).
Prints figures; it does not pass or fail.

    python -m bench.policy_latency [--waiting 2000] [--iters 200]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from engines.request import Request
from ipc.params import SamplingParams
from policies.global_queue import Lane, Shed, Waiting, plan as plan_queue
from policies.offload import plan_offloads
from policies.predictor import LinearPredictor, MemoPredictor, Predictor
from policies.value import edf, order_by_value, slack

TOKEN_BUDGET = 512


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


def time_calls(fn: Callable[[], object], iters: int) -> list[float]:
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)


def report(label: str, times: list[float]) -> None:
    p50, p99 = times[len(times) // 2], times[int(len(times) * 0.99)]
    print(f"  {label:32s} mean {statistics.fmean(times) * 1e3:6.2f} ms  "
          f"p50 {p50 * 1e3:6.2f} ms  p99 {p99 * 1e3:6.2f} ms")


def bench(name: str, predictor: Predictor, waiting: list[Request], iters: int) -> None:
    now = 1.0

    def order() -> list:
        return order_by_value(waiting, now, edf, predictor, TOKEN_BUDGET)

    ordered = order()

    def plan() -> object:
        return plan_offloads(ordered, now, predictor=predictor, token_budget=TOKEN_BUDGET,
                             next_batch_time=0.05, threshold=1.0, ipc_delay=0.002)

    def both() -> object:
        return plan_offloads(order(), now, predictor=predictor, token_budget=TOKEN_BUDGET,
                             next_batch_time=0.05, threshold=1.0, ipc_delay=0.002)

    print(f"{name}:")
    report("order_by_value (edf)", time_calls(order, iters))
    report("order_by_value (slack)", time_calls(
        lambda: order_by_value(waiting, now, slack, predictor, TOKEN_BUDGET), iters))
    report("plan_offloads", time_calls(plan, iters))
    report("order_by_value + plan_offloads", time_calls(both, iters))


def bench_global_queue(n: int, iters: int) -> None:
    """One plan of the controller's queue: `n` requests, two LPs, one HP, all behind."""
    rng = random.Random(1)
    queue = []
    for i in range(n):
        arrival, cost = rng.uniform(0.0, 1.0), rng.uniform(0.002, 0.3)
        queue.append(Waiting(f"w{i}", arrival, arrival + 1.0, cost, cost))
    lps, hps = [Lane(0, 0.3), Lane(1, 0.5)], [Lane(2, 0.2)]
    print(f"controller global queue, {n} waiting:")
    for shed in (Shed.DROP, Shed.DEMOTE):
        report(f"global_queue.plan ({shed.value})", time_calls(
            lambda: plan_queue(queue, lps, hps, 1.0, 0.4, shed), iters))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", type=int, default=2000)
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    waiting = waiting_queue(args.waiting)
    linear = LinearPredictor(seconds_per_token=1e-4, fixed=0.01)
    print(f"{args.waiting} waiting requests, token budget {TOKEN_BUDGET}, {args.iters} calls each")
    bench("LinearPredictor", linear, waiting, args.iters)
    bench("MemoPredictor(LinearPredictor), warm", MemoPredictor(linear), waiting, args.iters)
    per_layer = PerLayerPredictor(seconds_per_token=1e-4, fixed=0.01)
    bench("PerLayerPredictor", per_layer, waiting, max(1, args.iters // 10))
    bench("MemoPredictor(PerLayerPredictor), warm", MemoPredictor(per_layer), waiting, args.iters)
    from daemon.waiting_room import HORIZON
    bench_global_queue(HORIZON, args.iters)


if __name__ == "__main__":
    main()
