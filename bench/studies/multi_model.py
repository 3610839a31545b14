"""MuxServe's question on the simulator: two models of skewed popularity on one box --
dedicated GPUs per model, or every GPU multiplexing both?

    python -m bench.studies.multi_model --gpus 2,4 --seeds 0,1,2 --out docs/figures/multi_model.json

Two models of the profile's shape (e.g. two fine-tunes of Llama-3-8B), model A drawing
`share` of the requests and B the rest, one Poisson workload. Placements on `n` GPUs:

* **dedicated k+m** (Sarathi-Serve): A's requests on k GPUs of their own, B's on m, split
  by popularity (k = n x share rounded, at least one each); one simulation per model.
* **vLLM V1 dedicated k+m**: the same split, each instance in vLLM V1's mode (its
  per-model baseline).
* **multiplexed n**: every GPU holds both models' weights and serves both: the real
  multiplexed instance (engines/mux_core.py) in the simulator -- one KV pool of what the
  GPU's memory holds after both weights, in head-wise units, shared by both models' live
  requests; each step runs each model's part in turn (its time the sum of the parts'
  profile times), the step's token budget split by popularity over TBT target.

Capacity is the highest total rate at which *each* model holds 90 % goodput (both
TTFT and mean-TBT targets), found by bisection (bench/ruler/capacity.py) over whole runs
of `--num-requests` requests per rate -- a reduced protocol, not the steady-state ruler:
no warm-up cut, no per-window check. What multiplexing costs the popular model is read at
the dedicated placement's capacity: A's p99 TTFT and mean TBT there, dedicated vs
multiplexed.
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import time

import msgspec

from bench.json_file import write_json
from bench.loadgen.workload import WorkloadRequest
from bench.loadgen.workloads import build_requests, workload
from bench.parallel import add_workers_flag, run_parallel
from bench.records.results import is_good, percentiles
from bench.ruler.capacity import CAPACITY_TARGET, find_capacity
from bench.sim.sim_instances import SimConfig
from bench.sim.simulator import Simulation
from daemon.core.controller_config import SloConfig
from engines.scheduler_config import SchedulerConfig

PROFILE = "a100-llama3-8b"
MODELS = ("A", "B")
PLACEMENTS = ("dedicated", "vllm-v1 dedicated", "multiplexed")
#: The step budget of the Sarathi-Serve instances (vLLM V1 has its own: engines/modes.py).
CHUNK_SIZE = 2048


def assign_models(requests: list[WorkloadRequest], share: float, seed: int,
                  ) -> list[WorkloadRequest]:
    """Each request for A with probability `share`, else for B (seeded)."""
    rng = random.Random(seed * 7919 + 17)
    return [msgspec.structs.replace(r, model=MODELS[0] if rng.random() < share else MODELS[1])
            for r in requests]


def split(gpus: int, share: float) -> tuple[int, int]:
    """Dedicated GPUs of A and B, by popularity, at least one each."""
    a = min(max(round(gpus * share), 1), gpus - 1)
    return a, gpus - a


@dataclasses.dataclass(frozen=True)
class Case:
    placement: str
    gpus: int
    share: float
    seed: int
    num_requests: int


def simulate(case: Case, rate: float) -> list:
    """Every record of one run of `case` at `rate` total QPS."""
    requests = assign_models(build_requests(workload("poisson"), rate=rate,
                                            num_requests=case.num_requests, seed=case.seed,
                                            max_model_len=8192), case.share, case.seed)
    base = SimConfig(layout_modes=(), profile=PROFILE,
                     scheduler=SchedulerConfig(chunk_size=CHUNK_SIZE))
    if case.placement == "multiplexed":
        config = dataclasses.replace(base, layout_modes=("sarathi",) * case.gpus,
                                     models=tuple((m, PROFILE) for m in MODELS))
        return Simulation(config, requests).run()
    mode = "vllm-v1" if case.placement.startswith("vllm-v1") else "sarathi"
    records = []
    for model, gpus in zip(MODELS, split(case.gpus, case.share)):
        config = dataclasses.replace(base, layout_modes=(mode,) * gpus)
        mine = [msgspec.structs.replace(r, model="") for r in requests if r.model == model]
        for record in Simulation(config, mine).run():
            records.append(msgspec.structs.replace(record, model=model))
    return records


def per_model(records: list, slo: SloConfig) -> dict[str, dict]:
    """Each model's goodput %, p99 TTFT and mean TBT (s) over its completed requests."""
    out = {}
    for model in MODELS:
        mine = [r for r in records if r.model == model]
        done = [r for r in mine if r.outcome == "completed"]
        good = sum(is_good(r, slo.ttft_slo, slo.tbt_slo) for r in mine)
        out[model] = {
            "requests": len(mine),
            "goodput_pct": round(100 * good / len(mine), 1) if mine else None,
            "p99_ttft_s": _round(percentiles([r.ttft() for r in done]).p99),
            "mean_tbt_s": _round(percentiles([t for r in done
                                              if (t := r.mean_tbt()) is not None]).mean)}
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def capacity(case: Case) -> dict:
    """The highest rate at which both models hold CAPACITY_TARGET, and their goodput there."""
    slo, seen = SloConfig(), {}

    def holds(rate: float) -> bool:
        seen[rate] = per_model(simulate(case, rate), slo)
        return all(m["goodput_pct"] >= CAPACITY_TARGET for m in seen[rate].values())

    started = time.perf_counter()
    qps = find_capacity(holds, start_qps=1.0 * case.gpus, tolerance=0.04, max_runs=9)
    return {"placement": case.placement, "gpus": case.gpus, "seed": case.seed,
            "capacity_qps": round(qps, 3), "at_capacity": seen.get(qps),
            "runs": {f"{r:.3f}": v for r, v in sorted(seen.items())},
            "wall_s": round(time.perf_counter() - started, 1)}


def popular_model_cost(case: Case, rate: float) -> dict:
    """Model A's numbers at `rate` (the dedicated placement's capacity) in `case`."""
    return {"placement": case.placement, "gpus": case.gpus, "seed": case.seed, "qps": rate,
            **per_model(simulate(case, rate), SloConfig())}


def run(gpu_counts, seeds, share: float, num_requests: int, workers: int | None,
        progress=print) -> dict:
    cases = [Case(p, g, share, s, num_requests) for g in gpu_counts for s in seeds
             for p in PLACEMENTS]
    rows = run_parallel(capacity, cases, workers)
    for row in rows:
        if progress:
            at = row["at_capacity"] or {}
            progress(f"{row['gpus']} GPUs seed {row['seed']} {row['placement']:>18}: "
                     f"{row['capacity_qps']:.2f} QPS  "
                     + "  ".join(f"{m} {v['goodput_pct']} %" for m, v in at.items()))
    dedicated = {(r["gpus"], r["seed"]): r["capacity_qps"] for r in rows
                 if r["placement"] == "dedicated"}
    cost_cases = [(Case(p, g, share, s, num_requests), dedicated[g, s])
                  for g in gpu_counts for s in seeds for p in ("dedicated", "multiplexed")]
    costs = run_parallel(_cost_job, cost_cases, workers)
    return {"figure": "multi_model", "profile": PROFILE, "share_A": share,
            "num_requests": num_requests, "seeds": list(seeds), "gpus": list(gpu_counts),
            "slo": msgspec.to_builtins(SloConfig()), "chunk_size": CHUNK_SIZE,
            "protocol": "reduced: whole runs, no warm-up cut, bisection to 4 %",
            "capacity": rows, "popular_model_cost": costs}


def _cost_job(job: tuple[Case, float]) -> dict:
    return popular_model_cost(*job)


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
