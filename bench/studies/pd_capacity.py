"""P/D disaggregation (DistServe) on the capacity ruler, beside Ascendra and the tuned
baselines, at a reduced protocol a laptop can run (the full table is `ascendra reproduce
capacity`, whose rows include 2P1D and 1P2D).

    python -m bench.studies.pd_capacity --measured 900 --seeds 0 --out docs/figures/pd_capacity.json

Per workload, each subject's steady-state capacity (bench/ruler/ruler.py) searched from the
hardware ceiling; the baselines at their best settings in the full table (Sarathi-Serve
chunk 2048, vLLM budget 8192 with the drop rule). `--interconnect pcie4` prices the KV
hand-off over PCIe instead of the profile GPU's NVLink.
"""
from __future__ import annotations

import argparse
import time

import msgspec

from bench.json_file import write_json
from bench.loadgen.workloads import workload
from bench.parallel import add_workers_flag, run_parallel
from bench.ruler.ceiling import workload_ceilings
from bench.ruler.ruler import START_GROWTH, RulerConfig, Subject, seed_capacity
from bench.studies.reproduce import CAPACITY_WORKLOADS
from engines.scheduler_config import SchedulerConfig

SUBJECTS = (
    Subject(label="3xsarathi@2048", layout="3xsarathi", scheduler=SchedulerConfig(chunk_size=2048)),
    Subject(label="3xvllm-v0@8192 drops", layout="3xvllm-v0",
            scheduler=SchedulerConfig(chunk_size=8192, drop_expired=True)),
    Subject(label="2L1H", layout="2L1H"),
    Subject(label="2P1D", layout="2P1D"),
    Subject(label="1P2D", layout="1P2D"),
)


def _job(job) -> dict:
    subject, config, seed, start = job
    result = seed_capacity(subject, config, seed, start, START_GROWTH)
    return {"workload": config.workload.name, "label": subject.label, "seed": seed,
            "capacity_qps": result.capacity_qps, "bracketed": result.bracketed,
            "points": len(result.points)}


def run(names, measured: int, seeds, interconnect: str, workers: int | None = None,
        labels=None) -> dict:
    configs = [RulerConfig(workload=workload(name), measured=measured, seeds=tuple(seeds),
                           tolerance=0.05, interconnect=interconnect) for name in names]
    subjects = [s for s in SUBJECTS if labels is None or s.label in labels]
    jobs = [(s, c, seed, 0.8 * workload_ceilings(c).all_served_qps) for c in configs for s in subjects
            for seed in c.seeds]
    started = time.perf_counter()
    found = run_parallel(_job, jobs, workers)
    table = {}
    for row in found:
        table.setdefault(row["workload"], {}).setdefault(row["label"], []).append(row)
    summary = {w: {label: round(sum(r["capacity_qps"] for r in rows) / len(rows), 3)
                   for label, rows in by_label.items()} for w, by_label in table.items()}
    return {"figure": "pd_capacity", "measured": measured, "seeds": list(seeds),
            "interconnect": interconnect or "profile GPU's NVLink",
            "config": msgspec.to_builtins(configs[0]), "mean_qps": summary, "runs": found,
            "wall_s": round(time.perf_counter() - started, 1)}


def markdown(doc: dict) -> str:
    labels = [s.label for s in SUBJECTS if any(s.label in row for row in doc["mean_qps"].values())]
    lines = ["| workload | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for name, row in doc["mean_qps"].items():
        lines.append(f"| {name} | " + " | ".join(f"{row.get(l, float('nan')):.2f}" for l in labels) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(CAPACITY_WORKLOADS))
    p.add_argument("--measured", type=int, default=900)
    p.add_argument("--seeds", default="0")
    p.add_argument("--interconnect", default="")
    p.add_argument("--subjects", default="", help="comma-separated labels (default: all)")
    add_workers_flag(p)
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    doc = run(args.workloads.split(","), args.measured, [int(s) for s in args.seeds.split(",")],
              args.interconnect, args.workers,
              set(args.subjects.split(",")) if args.subjects else None)
    print(markdown(doc))
    if args.out:
        write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
