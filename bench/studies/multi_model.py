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
import json
import time
from pathlib import Path

import msgspec

from bench.json_file import write_json
from bench.parallel import add_workers_flag, imap, run_parallel
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
    """`progress` takes a line (a JSON row) as each capacity search ends."""
    jobs = [(k, g, share, s, num_requests) for g in gpu_counts for s in seeds
            for k in PLACEMENTS]
    rows = []
    for row in imap(_capacity_job, jobs, workers):
        rows.append(row)
        if progress:
            progress(json.dumps(row))
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


def table(doc: dict) -> str:
    """The study's two markdown tables: capacity by placement (each seed, mean, ratio to
    dedicated) and what multiplexing costs model A at the dedicated capacity."""
    rows, lines = doc["capacity"], []
    lines += ["| GPUs | placement | capacity, QPS (seeds " + ", ".join(map(str, doc["seeds"]))
              + ") | mean | x dedicated |", "|---|---|---|---|---|"]
    for gpus in doc["gpus"]:
        mine = [r for r in rows if r["gpus"] == gpus]
        base = _mean([r["capacity_qps"] for r in mine if r["kind"] == "dedicated"])
        for kind in PLACEMENTS:
            caps = [r["capacity_qps"] for r in mine if r["kind"] == kind]
            label = next(r["placement"] for r in mine if r["kind"] == kind)
            lines.append(f"| {gpus} | {kind} ({label}) | {' / '.join(f'{c:.2f}' for c in caps)}"
                         f" | {_mean(caps):.2f} | {_mean(caps) / base:.2f} |")
    lines += ["", "| GPUs | at QPS (dedicated capacity, per seed) | A goodput: dedicated / "
              "multiplexed | A p99 TTFT, s (same) | A mean TBT, s (same) | B goodput (same) |", "|---|---|---|---|---|---|"]
    for gpus in doc["gpus"]:
        cost = {k: [c for c in doc["popular_model_cost"] if c["gpus"] == gpus and c["kind"] == k]
                for k in ("dedicated", "multiplexed")}
        d, m = cost["dedicated"], cost["multiplexed"]

        def pair(model: str, key: str, fmt: str) -> str:
            return (f"{format(_mean([c[model][key] for c in d]), fmt)} / "
                    f"{format(_mean([c[model][key] for c in m]), fmt)}")
        rates = " / ".join(f"{c['qps']:.2f}" for c in d)
        lines.append(f"| {gpus} | {rates} | "
                     f"{pair('A', 'goodput_pct', '.1f')} % | {pair('A', 'p99_ttft_s', '.2f')} | "
                     f"{pair('A', 'mean_tbt_s', '.3f')} | {pair('B', 'goodput_pct', '.1f')} % |")
    return "\n".join(lines)


def _mean(values) -> float:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else float("nan")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--table", metavar="JSON", default="",
                   help="print the markdown tables of a result written by --out, and stop")
    p.add_argument("--share", type=float, default=0.8, help="model A's share of requests")
    p.add_argument("--gpus", default="2,4", help="GPU counts, comma-separated")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--num-requests", type=int, default=600)
    p.add_argument("--out", default="")
    add_workers_flag(p)
    args = p.parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return 0
    doc = run([int(g) for g in args.gpus.split(",")], [int(s) for s in args.seeds.split(",")],
              args.share, args.num_requests, args.workers,
              progress=lambda line: print(line, flush=True))
    if args.out:
        write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
