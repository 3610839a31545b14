"""Overload: how many requests each layout serves within their SLOs when the load is far
past every layout's capacity (issue #14: 15 QPS for 10 simulated minutes on ShareGPT,
9,000 requests, about 1.5x the best baseline's capacity).

Every layout gets the same drop rule -- a waiting request whose TTFT SLO is lost is
dropped with a clear answer (the baselines' `drop_expired`; Ascendra's controller sheds
what it predicts cannot make it, `shed = drop`) -- and every request must get a terminal
answer (none lost). Prints one row per layout and the ratio to the best baseline.

    python -m bench.overload [--qps 15] [--minutes 10] [--seed 0]
"""
from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor

from bench.ruler import RulerConfig, Subject, sim_config
from bench.simulate import simulate
from bench.workloads import build_requests, workload
from daemon.controller_config import ControllerConfig
from engines.scheduler_config import SchedulerConfig

BASELINES = ("3xvllm", "3xsarathi")


def _run(job) -> tuple[str, object]:
    layout, qps, n, seed = job
    baseline = layout in BASELINES
    subject = Subject(label=layout, layout=layout,
                      scheduler=SchedulerConfig(drop_expired=baseline))
    config = RulerConfig(controller=ControllerConfig(shed="drop"))
    requests = build_requests(workload("poisson"), rate=qps, num_requests=n, seed=seed,
                              max_model_len=config.max_model_len)
    return layout, simulate(sim_config(subject, config), requests, seed=seed,
                            config={"layout": layout, "qps": qps})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qps", type=float, default=15.0)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layouts", default="2L1H,3xvllm,3xsarathi")
    args = parser.parse_args(argv)
    n = round(args.qps * args.minutes * 60)
    layouts = args.layouts.split(",")
    print(f"overload: ShareGPT, Poisson {args.qps:g} QPS for {args.minutes:g} simulated "
          f"minutes ({n} requests), a100-llama3-8b, seed {args.seed}; drops on everywhere")
    with ProcessPoolExecutor(max_workers=2) as pool:
        results = dict(pool.map(_run, [(layout, args.qps, n, args.seed) for layout in layouts]))
    best = max((results[b].good for b in BASELINES if b in results), default=0)
    print(f"{'layout':>10} {'within SLO':>11} {'share':>7} {'completed':>10} {'dropped':>8} "
          f"{'errored':>8} {'lost':>5} {'vs best baseline':>17}")
    for layout in layouts:
        r = results[layout]
        ratio = f"{r.good / best:.2f}x" if best else "-"
        print(f"{layout:>10} {r.good:>11} {r.goodput_pct:>6.1f}% {r.completed:>10} "
              f"{r.dropped:>8} {r.errored:>8} {r.lost:>5} {ratio:>17}")
    return 0 if all(r.lost == 0 for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
