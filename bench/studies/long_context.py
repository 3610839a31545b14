"""LoongServe's question on the simulator: long prompts (16k-100k tokens) -- split one
prefill over k instances (elastic sequence parallelism), or leave it to one?

    python -m bench.studies.long_context --seeds 0,1,2 --duration 600 --workers 2 \
        --out docs/figures/long_context.json

Two parts, on the profile (A100, Llama-3-8B shape; its context stretched to 128k as
Llama-3.1's):

1. **one long prefill** (`prefill_table`): seconds to the first token of an L-token prompt
   run alone on one GPU in chunks of `chunk` tokens (Ascendra's HP taking an offload, a P/D
   prefill instance -- plus its KV crossing NVLink to the decode instance), and as one ESP
   step over k GPUs as the ESP group runs it (engines/executors/profiles/esp_time.py: each
   GPU's stripe of the prompt, plus one all-gather of the layer's KV per layer, priced
   from the NCCL all-reduce table; not overlapped).
2. **a mixed workload** (`mixed_workload`): ShareGPT requests at `short_qps` (TTFT 1 s,
   TBT 0.15 s) with long prompts arriving at `long_qps` (TTFT `long_ttft` s), through
   the real cores on 2L1H (the LP offloads a long prompt to the HP), 2P1D, 3xsarathi and
   those with ESP groups (`+esp<k>`: the controller forms a group of up to k instances for
   a prompt predicted to miss its TTFT alone, daemon/core/esp_groups.py, and the
   simulator runs the group's prefill step at esp_time's price; `+esp<k>:<n>`: and for
   every prompt of at least n tokens, an operator's setting); goodput per class, per
   seed and over the seeds. A layout is any ruler setting (bench/ruler/capacity_table.py
   `parse_setting`: `3xvllm-v0@8192+drops`, `3A`, ...) with an optional `+esp<k>[:<n>]`.
3. **the capacity of the mix** (`--capacity`, `mixed_capacity`): the highest short-request
   rate at which the short class's goodput over the seeds together stays at or above
   `--target` %, the long prompts kept at `long_qps` (the documents' load is the
   deployment's given; the question is how much chat fits beside it), searched by the
   ruler's `find_capacity`; at the capacity, each class's goodput (who pays).

    python -m bench.studies.long_context --capacity --seeds 0 --duration 300 --max-runs 4 \
        --tolerance 0.15 --workers 2 --out docs/figures/long_context_capacity.json \
        --layouts 2L1H+esp3,2L1H,3xvllm-v0@8192+drops,2P1D,3xsarathi,3A,3A+esp3
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import time

import msgspec

from bench.json_file import write_json
from bench.parallel import add_workers_flag, imap
from bench.loadgen.workload import WorkloadRequest
from bench.loadgen.workloads import build_requests, workload
from bench.records.results import is_good
from bench.sim.box_run import simulate
from bench.ruler.capacity import CAPACITY_TARGET, find_capacity
from bench.ruler.capacity_table import parse_setting
from bench.ruler.ruler import RulerConfig, sim_config
from daemon.core.controller_config import SloConfig
from daemon.core.esp_groups import EspSettings
from engines.executors.profiles.esp_time import esp_prefill_time
from engines.executors.profiles.interconnect import get_interconnect
from engines.executors.profiles.registry import get_profile
from policies.batch_shape import BatchShape

PROFILE = "a100-llama3-8b"
LENGTHS = (16_384, 32_768, 65_536, 100_000)
MAX_MODEL_LEN = 131_072
#: A layout's suffix that turns ESP groups on, with their largest degree: "2L1H+esp3".
ESP_SUFFIX = "+esp"
#: The capacity search's step up (or down) from its first rate before it bisects.
CAPACITY_GROWTH = 1.5


def single_gpu_prefill(profile, length: int, chunk: int) -> float:
    """Seconds to prefill `length` tokens alone on one GPU, `chunk` tokens a step."""
    seconds, done = 0.0, 0
    while done < length:
        n = min(chunk, length - done)
        seconds += profile.step_time(BatchShape.of(prefills=[(n, done)]), num_sampling=1)
        done += n
    return seconds


def prefill_table(chunk: int = 2048, ks=(2, 3)) -> list[dict]:
    profile = get_profile(PROFILE)
    link = get_interconnect("", profile.hardware.name)
    rows = []
    for length in LENGTHS:
        one = single_gpu_prefill(profile, length, chunk)
        row = {"prompt_tokens": length, "one_gpu_s": round(one, 3),
               "pd_s": round(one + link.transfer_seconds(length * profile.kv_bytes_per_token), 3),
               "kv_gib": round(length * profile.kv_bytes_per_token / 2**30, 2)}
        for k in ks:
            esp = esp_prefill_time(profile, length, k)
            row[f"esp{k}_s"] = round(esp.total, 3)
            row[f"esp{k}_exchange_s"] = round(esp.exchange, 3)
            row[f"esp{k}_speedup"] = round(one / esp.total, 2)
            row[f"esp{k}_gpu_s"] = round(k * esp.total, 3)  # GPU-seconds the k GPUs are held
        rows.append(row)
    return rows


def long_requests(qps: float, count: int, output_len: int, ttft: float, seed: int,
                  start_index: int) -> list[WorkloadRequest]:
    rng = random.Random(seed * 31 + 5)
    t, out = 0.0, []
    for i in range(count):
        t += rng.expovariate(qps)
        out.append(WorkloadRequest(index=start_index + i, arrival=t,
                                   prompt_len=rng.randint(LENGTHS[0], LENGTHS[-1]),
                                   output_len=output_len, ttft_slo=ttft, tbt_slo=0.15,
                                   slo_class="long"))
    return out


def mixed_workload(short_qps: float, long_qps: float, duration: float, long_ttft: float,
                   seed: int) -> list[WorkloadRequest]:
    short = build_requests(workload("poisson"), rate=short_qps,
                           num_requests=int(short_qps * duration), seed=seed,
                           max_model_len=8192)
    short = [msgspec.structs.replace(r, slo_class="short", ttft_slo=1.0, tbt_slo=0.15)
             for r in short]
    longs = long_requests(long_qps, max(1, int(long_qps * duration)), 128, long_ttft, seed,
                          len(short))
    merged = sorted(short + longs, key=lambda r: r.arrival)
    return [msgspec.structs.replace(r, index=i) for i, r in enumerate(merged)]


def esp_settings(layout: str) -> tuple[str, EspSettings]:
    """A study layout's base layout and ESP settings: "2L1H" (off), "2L1H+esp3" (groups
    of up to 3 for prompts predicted to miss alone), "2L1H+esp3:40000" (and every prompt
    of at least 40,000 tokens, an operator's length)."""
    base, _, esp = layout.partition(ESP_SUFFIX)
    degree, _, min_tokens = esp.partition(":")
    return base, EspSettings(max_degree=int(degree or 1), min_tokens=int(min_tokens or 0))


def mixed_row(job: tuple) -> dict:
    """One layout on one seed's mixed workload: each class's goodput and TTFTs."""
    layout, short_qps, long_qps, duration, long_ttft, seed = job
    requests = mixed_workload(short_qps, long_qps, duration, long_ttft, seed)
    slo = SloConfig()
    base, esp = esp_settings(layout)
    sim = dataclasses.replace(
        sim_config(parse_setting(base), RulerConfig(profile=PROFILE, slo=slo,
                                                    max_model_len=MAX_MODEL_LEN)), esp=esp)
    records = simulate(sim, requests, keep_records=True).records
    row = {"layout": layout, "seed": seed,
           "esp_groups": sum(1 for r in records if r.esp_group),
           "lost": sum(1 for r in records if r.outcome == "lost")}
    for cls in ("short", "long"):
        mine = [r for r in records if r.slo_class == cls]
        good = sum(is_good(r, r.ttft_slo or slo.ttft_slo, r.tbt_slo or slo.tbt_slo)
                   for r in mine)
        ttfts = sorted(r.ttft() for r in mine if r.ttft() is not None)
        row[cls] = {"requests": len(mine), "goodput_pct": round(100 * good / len(mine), 1),
                    "p50_ttft_s": round(ttfts[len(ttfts) // 2], 3) if ttfts else None,
                    "max_ttft_s": round(ttfts[-1], 3) if ttfts else None}
    return row


def run_mixed(layouts, short_qps: float, long_qps: float, duration: float, long_ttft: float,
              seeds, workers: int | None = None, progress=print) -> list[dict]:
    """Every layout on every seed, over `workers` processes (bench/parallel.py)."""
    jobs = [(layout, short_qps, long_qps, duration, long_ttft, seed)
            for seed in seeds for layout in layouts]
    rows = []
    for row in imap(mixed_row, jobs, workers):
        rows.append(row)
        if progress:
            progress(f"seed {row['seed']} {row['layout']:>16}: short "
                     f"{row['short']['goodput_pct']} %, long {row['long']['goodput_pct']} % "
                     f"(p50 TTFT {row['long']['p50_ttft_s']} s), {row['esp_groups']} ESP "
                     f"groups, {row['lost']} lost")
    return rows


def over_seeds(rows: list[dict]) -> list[dict]:
    """Per layout: each class's goodput over every seed's requests together."""
    out = []
    for layout in dict.fromkeys(r["layout"] for r in rows):
        mine = [r for r in rows if r["layout"] == layout]
        row = {"layout": layout, "seeds": [r["seed"] for r in mine],
               "esp_groups": sum(r["esp_groups"] for r in mine),
               "lost": sum(r["lost"] for r in mine)}
        for cls in ("short", "long"):
            n = sum(r[cls]["requests"] for r in mine)
            good = sum(r[cls]["requests"] * r[cls]["goodput_pct"] / 100 for r in mine)
            row[cls] = {"requests": n, "goodput_pct": round(100 * good / n, 1) if n else None}
        out.append(row)
    return out


def mixed_capacity(job: tuple) -> dict:
    """One layout's capacity of the mix: the highest short rate whose short goodput over
    `seeds` together is at least `target` %, long prompts at `long_qps`; every rate tried,
    with each class's goodput there (who pays)."""
    layout, long_qps, duration, long_ttft, seeds, target, start, tolerance, max_runs = job
    points = []

    def holds(short_qps: float) -> bool:
        rows = [mixed_row((layout, short_qps, long_qps, duration, long_ttft, seed))
                for seed in seeds]
        pooled = over_seeds(rows)[0]
        points.append({"short_qps": round(short_qps, 4),
                       "short_goodput_pct": pooled["short"]["goodput_pct"],
                       "long_goodput_pct": pooled["long"]["goodput_pct"],
                       "long_requests": pooled["long"]["requests"],
                       "esp_groups": pooled["esp_groups"], "lost": pooled["lost"]})
        return pooled["short"]["goodput_pct"] >= target

    capacity = find_capacity(holds, start_qps=start, tolerance=tolerance, max_runs=max_runs,
                             growth=CAPACITY_GROWTH)
    points.sort(key=lambda p: p["short_qps"])
    at = next((p for p in points if p["short_qps"] == round(capacity, 4)), None)
    return {"layout": layout, "capacity_short_qps": round(capacity, 3), "at_capacity": at,
            "points": points}


def run_capacity(layouts, long_qps: float, duration: float, long_ttft: float, seeds,
                 target: float, start: float, tolerance: float, max_runs: int,
                 workers: int | None = None, progress=print) -> list[dict]:
    """Every layout's `mixed_capacity`, a layout a job over `workers` processes."""
    jobs = [(layout, long_qps, duration, long_ttft, tuple(seeds), target, start, tolerance,
             max_runs) for layout in layouts]
    rows = []
    for row in imap(mixed_capacity, jobs, workers):
        rows.append(row)
        if progress:
            progress(f"{row['layout']:>22}: capacity {row['capacity_short_qps']} short QPS; "
                     f"there: {row['at_capacity']}")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layouts",
                   default="2L1H,2L1H+esp3,2L1H+esp3:40000,2P1D,3xsarathi,3xsarathi+esp3:40000")
    p.add_argument("--short-qps", type=float, default=6.0)
    p.add_argument("--long-qps", type=float, default=0.05)
    p.add_argument("--duration", type=float, default=600.0)
    p.add_argument("--long-ttft", type=float, default=15.0)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", default="")
    p.add_argument("--capacity", action="store_true",
                   help="search each layout's capacity of the mix (short QPS) instead")
    p.add_argument("--target", type=float, default=CAPACITY_TARGET,
                   help="the short class's goodput (%%) a rate must hold")
    p.add_argument("--start-qps", type=float, default=4.0)
    p.add_argument("--tolerance", type=float, default=0.1)
    p.add_argument("--max-runs", type=int, default=6)
    add_workers_flag(p)
    args = p.parse_args(argv)
    started = time.perf_counter()
    seeds = [int(x) for x in args.seeds.split(",")]
    if args.capacity:
        return capacity_main(args, seeds, started)
    table = prefill_table()
    for row in table:
        print(row)
    mixed = run_mixed(args.layouts.split(","), args.short_qps, args.long_qps, args.duration,
                      args.long_ttft, seeds, args.workers)
    overall = over_seeds(mixed)
    for row in overall:
        print(row)
    doc = {"figure": "long_context", "profile": PROFILE, "prefill": table,
           "mixed": {"short_qps": args.short_qps, "long_qps": args.long_qps,
                     "duration_s": args.duration, "long_ttft_slo_s": args.long_ttft,
                     "seeds": seeds, "rows": mixed, "over_seeds": overall},
           "wall_s": round(time.perf_counter() - started, 1)}
    if args.out:
        write_json(args.out, doc)
    return 0


def capacity_main(args, seeds: list[int], started: float) -> int:
    protocol = {"long_qps": args.long_qps, "duration_s": args.duration,
                "long_ttft_slo_s": args.long_ttft, "seeds": seeds, "target_pct": args.target,
                "judged_on": "the short class's goodput over the seeds together",
                "start_qps": args.start_qps, "growth": CAPACITY_GROWTH,
                "tolerance": args.tolerance, "max_runs": args.max_runs}
    print("capacity of the long-context mix:", protocol)
    rows = run_capacity(args.layouts.split(","), args.long_qps, args.duration, args.long_ttft,
                        seeds, args.target, args.start_qps, args.tolerance, args.max_runs,
                        args.workers)
    doc = {"figure": "long_context_capacity", "profile": PROFILE, "protocol": protocol,
           "rows": rows, "wall_s": round(time.perf_counter() - started, 1)}
    if args.out:
        write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
