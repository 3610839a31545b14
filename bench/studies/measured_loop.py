"""The loop closed on this machine: a live daemon with one torch instance under the real
load generator, against `ascendra simulate --profile FILE` (the same machine's executor,
profiled by `ascendra profile`) on the same requests, at a few rates.

    python -m bench.studies.measured_loop --profile tiny-cpu.json [--rates 0.5,1.5]
        [--num-requests 60] [--max-prompt-len 128] [--model DIR] [--out DIR]
        [--instances 2] [--torch-threads 1]

Both sides get the same layout (`--instances` x sarathi), model length, chunk size,
sequence limit, KV cache size and SLOs. What differs is time: the daemon's steps are the
executor's real ones (and the machine's other load), plus the scheduler's own CPU time,
the event loops and the client; the simulator's are the profile's fit plus the host
costs the profile measured on the daemon's path (when it did). Each live instance runs
on `--torch-threads` torch threads (default 1: on a small CPU shared with the controller
and the client, more threads wait at every operator for a core another process holds).
It prints goodput, p50/p90 TTFT and mean TBT side by side, each instance's p50 TTFT and
mean TBT (several instances: how far they drift apart), the load average before and
after each side and the share of CPU time the hypervisor stole during the live side
(/proc/stat; this machine is shared), and writes both result JSONs and `summary.json`.
`--step-log` has each live instance record its steps (`serve --step-log`,
engines/step_log.py) in `<out>/steps_<rate>/`, for bench/profiling/step_log_study.py.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.launch.daemon_launcher import ServeProcess
from bench.records.results import read_result
from engines.executors.profiles.measured import load_measured


def _shared(profile_path: str, args) -> list[str]:
    """Flags both the daemon and the simulator take, from the profile's executor."""
    data = load_measured(profile_path).data
    return ["--layout", f"{args.instances}xsarathi", "--max-model-len", str(args.max_model_len),
            "--chunk-size", str(args.chunk_size), "--max-num-seqs", str(args.max_num_seqs),
            "--num-kv-blocks", str(data.num_kv_blocks), "--ttft-slo", str(args.ttft_slo),
            "--tbt-slo", str(args.tbt_slo)]


def check(args, rate: float, out: Path) -> dict:
    shared = _shared(args.profile, args)
    load = ["--workload", "poisson", "--qps", str(rate), "--num-requests", str(args.num_requests),
            "--seed", str(args.seed), "--max-prompt-len", str(args.max_prompt_len)]
    live_json, sim_json = out / f"live_{rate}.json", out / f"sim_{rate}.json"
    serve = ["--executor", "torch", "--device", "cpu", *shared,
             "--torch-threads", str(args.torch_threads),
             *(["--model", args.model] if args.model else []),
             *(["--step-log", str(out / f"steps_{rate}")] if args.step_log else []),
             "--max-queued-requests", "100000", "--max-queued-tokens", "1000000000"]
    with ServeProcess(serve, start_timeout=300, log_path=out / f"daemon_{rate}.log") as daemon:
        load_live, cpu_before = os.getloadavg()[0], cpu_times()
        subprocess.run([sys.executable, "-m", "daemon.cli", "bench", "--url", daemon.url, *load,
                        "--max-model-len", str(args.max_model_len), "--json", str(live_json),
                        "--records", str(out / f"live_{rate}.records.jsonl"),
                        "--disable-tqdm", "--max-error-rate", "1"],
                       check=True, stdout=subprocess.DEVNULL)
        load_live, cpu_after = (load_live, os.getloadavg()[0]), cpu_times()
    subprocess.run([sys.executable, "-m", "daemon.cli", "simulate", *shared, *load,
                    "--profile", args.profile, "--json", str(sim_json),
                    "--records", str(out / f"sim_{rate}.records.jsonl")],
                   check=True, stdout=subprocess.DEVNULL)
    live, sim = read_result(live_json), read_result(sim_json)
    row = {"rate": rate, "load_live": [round(x, 2) for x in load_live],
           "steal_pct_live": steal_pct(cpu_before, cpu_after),
           **{f"{k}_{side}": v for side, r in (("live", live), ("sim", sim))
              for k, v in (("goodput_pct", round(r.goodput_pct, 1)),
                           ("p50_ttft_s", r.ttft_s.p50), ("p90_ttft_s", r.ttft_s.p90),
                           ("mean_tbt_s", r.mean_tbt_s.mean), ("completed", r.completed))}}
    if args.instances > 1:
        for side in ("live", "sim"):
            row[f"by_instance_{side}"] = by_instance(out / f"{side}_{rate}.records.jsonl")
    return row


def cpu_times() -> list[int]:
    """The machine's CPU time so far by kind, in ticks (/proc/stat's `cpu` line: user,
    nice, system, idle, iowait, irq, softirq, steal, ...); [] where there is none."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return []


def steal_pct(before: list[int], after: list[int]) -> float | None:
    """The share of the CPU time between two `cpu_times` the hypervisor gave to others
    (steal, the 8th field), in %; None where not known."""
    if len(before) < 8 or len(after) < 8:
        return None
    spent = [b - a for a, b in zip(before, after)]
    return round(100 * spent[7] / sum(spent[:8]), 2) if sum(spent[:8]) else None


def by_instance(records_path: Path) -> dict:
    """Each instance's requests: how many, p50 TTFT and mean of mean TBTs (seconds)."""
    from bench.records.records_file import read_records
    groups: dict = {}
    for row in read_records(records_path):
        if row.outcome == "completed" and row.instances:
            groups.setdefault(row.instances[-1], []).append(row)
    return {str(i): {"n": len(rows), "p50_ttft_s": statistics.median(r.ttft for r in rows),
                     "mean_tbt_s": statistics.fmean(r.mean_tbt for r in rows
                                                    if r.mean_tbt is not None)}
            for i, rows in sorted(groups.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.measured_loop",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", required=True, help="the file `ascendra profile` wrote")
    parser.add_argument("--model", default=None, help="the profiled model (default: tiny)")
    parser.add_argument("--rates", default="0.5,1.5", help="requests/s, comma-separated")
    parser.add_argument("--num-requests", type=int, default=60)
    parser.add_argument("--max-model-len", type=int, default=256)
    parser.add_argument("--chunk-size", type=int, default=512)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--ttft-slo", type=float, default=2.0)
    parser.add_argument("--tbt-slo", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-prompt-len", type=int, default=128,
                        help="trim ShareGPT's prompts to this (default %(default)s: a CPU)")
    parser.add_argument("--instances", type=int, default=1,
                        help="instances of the daemon and the simulation (default 1)")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch threads of each live instance (serve's "
                             "instances.torch_threads; default %(default)s: one core each)")
    parser.add_argument("--step-log", action="store_true",
                        help="each live instance records its steps in <out>/steps_<rate>/")
    parser.add_argument("--out", default="measured_loop")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for rate in (float(r) for r in args.rates.split(",")):
        row = check(args, rate, out)
        rows.append(row)
        print(json.dumps(row), flush=True)
    (out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
