"""MuxServe's question on the simulator: two models of skewed popularity on one box --
dedicated GPUs per model, or every GPU multiplexing both?

    python -m bench.studies.multi_model --gpus 2,4 --seeds 0,1,2 --out docs/figures/multi_model.json

Two models of the profile's shape (e.g. two fine-tunes of Llama-3-8B), model A drawing
`share` of the requests and B the rest, one Poisson workload. Placements on `n` GPUs
(bench/ruler/model_mix.py):

* **dedicated k+m** (Sarathi-Serve): A's requests on k GPUs of their own, B's on m, split
  by popularity (k = n x share, at least one each).
* **vLLM V1 dedicated k+m**: the same split, each instance in vLLM V1's mode (the
  per-model baseline).
* **multiplexed n**: every GPU holds both models' weights and serves both: the real
  multiplexed instance (engines/mux_core.py) in the simulator -- one KV pool of what the
  GPU's memory holds after both weights, in head-wise units, shared by both models' live
  requests; each step runs each model's part in turn (its time the sum of the parts'
  profile times), the step's token budget split by popularity over TBT target.

Capacity is the highest total rate at which *each* model holds 90 % goodput (both
targets), by bisection over whole runs (model_mix.PROTOCOL: a reduced protocol). What
multiplexing costs the popular model is read at the dedicated placement's capacity: A's
goodput, p99 TTFT and mean TBT there, dedicated vs multiplexed.
"""
from __future__ import annotations

import argparse
import time

import msgspec

from bench.json_file import write_json
from bench.parallel import add_workers_flag, run_parallel
from bench.ruler.model_mix import (
    PROTOCOL, Group, MixRun, Placement, capacity, per_model, popularity_split, simulate,
)

PROFILE = "a100-llama3-8b"
MODELS = ("A", "B")
PLACEMENTS = ("dedicated", "vllm-v1 dedicated", "multiplexed")
TOLERANCE = 0.04


def placement(kind: str, gpus: int, share: float) -> Placement:
    if kind == "multiplexed":
        return Placement((Group(MODELS, f"{gpus}xsarathi"),))
    mode = "vllm-v1" if kind.startswith("vllm-v1") else "sarathi"
    split = popularity_split(gpus, _mix(share))
    return Placement(tuple(Group((m,), f"{k}x{mode}") for m, k in zip(MODELS, split)))


def _mix(share: float) -> dict[str, float]:
    return {MODELS[0]: share, MODELS[1]: 1 - share}


def _run(share: float, seed: int, num_requests: int) -> MixRun:
    return MixRun(mix=tuple(_mix(share).items()), profiles=tuple((m, PROFILE) for m in MODELS),
                  seed=seed, num_requests=num_requests)


def _capacity_job(job: tuple[str, int, float, int, int]) -> dict:
    kind, gpus, share, seed, num_requests = job
    started = time.perf_counter()
    row = capacity(placement(kind, gpus, share), _run(share, seed, num_requests),
                   tolerance=TOLERANCE)
    return {"kind": kind, "gpus": gpus, "seed": seed, **row,
            "wall_s": round(time.perf_counter() - started, 1)}


def _cost_job(job: tuple[str, int, float, int, int, float]) -> dict:
    kind, gpus, share, seed, num_requests, rate = job
    run = _run(share, seed, num_requests)
    return {"kind": kind, "gpus": gpus, "seed": seed, "qps": rate,
            **per_model(simulate(placement(kind, gpus, share), run, rate), MODELS, run.slo)}


def run(gpu_counts, seeds, share: float, num_requests: int, workers: int | None,
        progress=print) -> dict:
    jobs = [(k, g, share, s, num_requests) for g in gpu_counts for s in seeds
            for k in PLACEMENTS]
    rows = run_parallel(_capacity_job, jobs, workers)
    for row in rows:
        if progress:
            at = row["at_capacity"] or {}
            progress(f"{row['gpus']} GPUs seed {row['seed']} {row['placement']:>22}: "
                     f"{row['capacity_qps']:.2f} QPS  "
                     + "  ".join(f"{m} {v['goodput_pct']} %" for m, v in at.items()))
    dedicated = {(r["gpus"], r["seed"]): r["capacity_qps"] for r in rows
                 if r["kind"] == "dedicated"}
    costs = run_parallel(_cost_job, [(k, g, share, s, num_requests, dedicated[g, s])
                                     for g in gpu_counts for s in seeds
                                     for k in ("dedicated", "multiplexed")], workers)
    return {"figure": "multi_model", "profile": PROFILE, "share_A": share,
            "num_requests": num_requests, "seeds": list(seeds), "gpus": list(gpu_counts),
            "protocol": PROTOCOL.format(n=num_requests, tol=100 * TOLERANCE),
            "run": msgspec.to_builtins(_run(share, 0, num_requests)),
            "capacity": rows, "popular_model_cost": costs}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--share", type=float, default=0.8, help="model A's share of requests")
    p.add_argument("--gpus", default="2,4", help="GPU counts, comma-separated")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--num-requests", type=int, default=600)
    p.add_argument("--out", default="")
    add_workers_flag(p)
    args = p.parse_args(argv)
    doc = run([int(g) for g in args.gpus.split(",")], [int(s) for s in args.seeds.split(",")],
              args.share, args.num_requests, args.workers)
    if args.out:
        write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
