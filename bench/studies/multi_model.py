"""MuxServe's question on the simulator: two models of skewed popularity on one box --
dedicated GPUs per model, or every GPU serving both?

    python -m bench.studies.multi_model --share 0.8 --out docs/figures/multi_model.json

Two models of the profile's shape (e.g. two fine-tunes of Llama-3-8B), model A drawing
`share` of the requests and B the rest, one Poisson workload. Placements, each a box of
Sarathi-Serve instances (the same scheduler everywhere, so only the placement differs):

* **dedicated k+m**: A's requests on k GPUs of their own, B's on m (by popularity when
  k > m); two simulations, one per model.
* **multiplexed n**: every one of n GPUs holds both models' weights and serves both
  (MuxServe's colocation): one simulation over all requests, routed least-loaded. A
  step that holds both models' work runs each model's part in turn (temporal
  multiplexing: the sum of the two parts' profile times, each part reading its own
  weights -- a conservative price; MuxServe's spatial sharing overlaps them), and the
  KV cache is what is left after both models' weights: one shared pool, so memory goes
  to each model in proportion to its live requests, i.e. its popularity (MuxServe's
  unified KV cache).

Goodput is counted per model (a request is good when it meets its TTFT and mean-TBT
targets), over every request of the run (warm-up included: a comparison, not the ruler).
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
from bench.records.results import is_good
from bench.sim.sim_instances import SimConfig
from bench.sim.simulator import Simulation
from daemon.core.controller_config import SloConfig
from engines.batch import Batch
from engines.executors.profiles.registry import get_profile
from engines.scheduler_config import SchedulerConfig

PROFILE = "a100-llama3-8b"
MODELS = ("A", "B")
#: (label, GPUs per model when dedicated -- or None: every GPU serves both)
PLACEMENTS = (("dedicated 1+1", (1, 1)), ("multiplexed 2", None),
              ("dedicated 2+1", (2, 1)), ("multiplexed 3", None))
GPUS = {"multiplexed 2": 2, "multiplexed 3": 3}


def assign_models(requests: list[WorkloadRequest], share: float, seed: int) -> dict[int, str]:
    """Each request's model: A with probability `share`, else B (seeded)."""
    rng = random.Random(seed * 7919 + 17)
    return {r.index: MODELS[0] if rng.random() < share else MODELS[1] for r in requests}


def multiplexed_latency(profile, model_of: dict[str, str]):
    """Seconds of a step holding requests of both models: each model's part in turn."""
    def latency(batch: Batch) -> float:
        parts: dict[str, Batch] = {}
        for chunk in batch.chunks:
            part = parts.setdefault(model_of[chunk.request.request_id], Batch())
            part.add_chunk(chunk)
        return sum(profile.step_time(p.shape(), num_sampling=p.num_sampling)
                   for p in parts.values())
    return latency


def multiplexed_kv_blocks(profile, block_size: int) -> int:
    """KV blocks left on a GPU that holds a second model's weights too."""
    second = profile.weight_bytes // (profile.kv_bytes_per_token * block_size)
    return profile.num_kv_blocks(block_size) - second


def _simulate(config: SimConfig, requests: list[WorkloadRequest], model_of=None) -> list:
    simulation = Simulation(config, requests)
    if model_of is not None:
        latency = multiplexed_latency(get_profile(config.profile), model_of)
        for instance in simulation.instances:
            instance.executor.latency_fn = latency
    return simulation.run()


def run_placement(label: str, dedicated, requests, models: dict[int, str], slo: SloConfig,
                  scheduler: SchedulerConfig) -> dict:
    base = SimConfig(layout_modes=(), profile=PROFILE, scheduler=scheduler, slo=slo)
    records = []
    if dedicated is not None:
        for model, gpus in zip(MODELS, dedicated):
            mine = [r for r in requests if models[r.index] == model]
            records += _simulate(_with(base, gpus), mine)
    else:
        profile = get_profile(PROFILE)
        config = _with(base, GPUS[label],
                       num_kv_blocks=multiplexed_kv_blocks(profile, base.block_size))
        records += _simulate(config, requests, {f"r{i}": m for i, m in models.items()})
    return _goodput(records, models, slo)


def _with(base: SimConfig, gpus: int, **fields) -> SimConfig:
    return dataclasses.replace(base, layout_modes=("sarathi",) * gpus, **fields)


def _goodput(records, models: dict[int, str], slo: SloConfig) -> dict:
    out = {}
    for model in MODELS:
        mine = [r for r in records if models[r.index] == model]
        good = sum(is_good(r, slo.ttft_slo, slo.tbt_slo) for r in mine)
        out[model] = {"requests": len(mine), "good": good,
                      "goodput_pct": round(100 * good / len(mine), 1) if mine else None}
    total = sum(v["good"] for v in out.values())
    out["all"] = {"requests": len(records), "good": total,
                  "goodput_pct": round(100 * total / len(records), 1) if records else None}
    return out


def sweep(rates, share: float, num_requests: int, seed: int, slo: SloConfig,
          scheduler: SchedulerConfig, progress=print) -> dict:
    rows = []
    started = time.perf_counter()
    for rate in rates:
        requests = build_requests(workload("poisson"), rate=rate, num_requests=num_requests,
                                  seed=seed, max_model_len=8192)
        models = assign_models(requests, share, seed)
        for label, dedicated in PLACEMENTS:
            result = run_placement(label, dedicated, requests, models, slo, scheduler)
            rows.append({"placement": label, "qps": rate, **result})
            if progress:
                progress(f"{rate:>5.1f} QPS {label:>14}: A {result['A']['goodput_pct']} %  "
                         f"B {result['B']['goodput_pct']} %  all {result['all']['goodput_pct']} %")
    return {"figure": "multi_model", "profile": PROFILE, "share_A": share, "seed": seed,
            "num_requests": num_requests, "slo": msgspec.to_builtins(slo),
            "scheduler": msgspec.to_builtins(scheduler), "rows": rows,
            "wall_s": round(time.perf_counter() - started, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--share", type=float, default=0.8, help="model A's share of requests")
    p.add_argument("--rates", default="2,3,4,5,6,7,8")
    p.add_argument("--num-requests", type=int, default=1500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    doc = sweep([float(r) for r in args.rates.split(",")], args.share, args.num_requests,
                args.seed, SloConfig(), SchedulerConfig(chunk_size=2048))
    if args.out:
        write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
