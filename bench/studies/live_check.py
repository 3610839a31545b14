"""The live check: the real daemon (sim executor on a GPU profile, real time, real sockets)
under the real load generator, against the simulator on the same requests -- one point
per workload. The two run the same controller and instance cores; what differs is time
(real clocks, an event loop, the client's own delays) and the scheduler's own CPU time,
which the simulator does not charge.

    python -m bench.studies.live_check [--layout 2L1H] [--points poisson:8,bursty-cv4:4,mixed-slo:8]
                               [--num-requests 2000] [--tenant-mix MIX] [--out DIR]

For each point it starts `ascendra serve --executor sim --profile PROFILE --layout L
--max-model-len 8192`, runs `ascendra bench --workload W --qps Q --num-requests N` against
it (same seed, so the same requests), stops it, and runs `ascendra simulate` with the same
flags; it prints goodput, throughput and TTFT side by side and writes both result JSONs
and `summary.json` (the table). With `--tenant-mix` (bench/loadgen/tenant_mix.py) the
load generator names each request's tenant in the x-llm-d-inference-fairness-id header
and the simulator hands the same tenant to its controller; goodput is then compared per
tenant too. With an `<n>A` layout (roles chosen online) it also counts the role changes
each side made (the daemon's `ascendra_role_changes_total`, scraped before it stops) and
prints the daemon's timeline of them (from its log); every run says how many requests got
no answer (`lost`).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bench.launch.daemon_launcher import ServeProcess
from bench.records.results import read_result

PROFILE = "a100-llama3-8b"
MAX_MODEL_LEN = 8192


def _serve_args(layout: str, scheduler: list[str], profile: str = PROFILE,
                max_model_len: int = MAX_MODEL_LEN) -> list[str]:
    return ["--executor", "sim", "--profile", profile, "--layout", layout, "--max-model-len",
            str(max_model_len), "--max-queued-requests", "100000", "--max-queued-tokens",
            "1000000000", *scheduler]


def check(layout: str, workload: str, qps: float, n: int, out: Path, port: int,
          scheduler: list[str] = (), tenant_mix: str = "", seed: int = 0,
          profile: str = PROFILE, max_model_len: int = MAX_MODEL_LEN) -> tuple:
    """`scheduler`: flags both the daemon and the simulator take (--chunk-size N,
    --drop-expired); `profile`, `max_model_len`: both sides' (the daemon's sim executor
    at the profile's own SLOs, as the simulator)."""
    flags = ["--workload", workload, "--qps", str(qps), "--num-requests", str(n), "--seed", str(seed),
             *(["--tenant-mix", tenant_mix] if tenant_mix else [])]
    live_json, sim_json = out / f"live_{layout}_{workload}.json", out / f"sim_{layout}_{workload}.json"
    with ServeProcess(_serve_args(layout, list(scheduler), profile, max_model_len), port=port,
                      start_timeout=120,
                      log_path=out / f"daemon_{layout}_{workload}.log") as daemon:
        subprocess.run([sys.executable, "-m", "daemon.cli", "bench", "--url", daemon.url, *flags,
                        "--max-model-len", str(max_model_len), "--json", str(live_json),
                        "--disable-tqdm",
                        "--max-error-rate", "1"], check=True, stdout=subprocess.DEVNULL)
        changes = role_changes(daemon.url)
    subprocess.run([sys.executable, "-m", "daemon.cli", "simulate", "--layout", layout,
                    "--profile", profile, "--max-model-len", str(max_model_len), *flags,
                    *scheduler, "--json", str(sim_json)], check=True,
                   stdout=subprocess.DEVNULL)
    return read_result(live_json), read_result(sim_json), changes


def role_changes(url: str) -> int:
    """The role changes a daemon has made (its `ascendra_role_changes_total`, every
    from/to pair)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return round(sum(sample.value for family in text_string_to_metric_families(text)
                     if family.name == "ascendra_role_changes"
                     for sample in family.samples if sample.name.endswith("_total")))


def _timeline(log: Path) -> list[str]:
    """The daemon log's role-change lines."""
    return [line.strip() for line in log.read_text(errors="replace").splitlines()
            if "changed role" in line]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.live_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layout", default="2L1H")
    parser.add_argument("--points", default="poisson:8,bursty-cv4:4,mixed-slo:8",
                        help="workload:qps,... (default %(default)s)")
    parser.add_argument("--num-requests", type=int, default=2000)
    parser.add_argument("--out", default="live_check")
    parser.add_argument("--chunk-size", type=int, help="the instances' token budget")
    parser.add_argument("--drop-expired", action="store_true",
                        help="the baselines' drop rule (a request whose TTFT SLO is lost)")
    parser.add_argument("--tenant-mix", default="",
                        help="NAME=SHARE[:WEIGHT[:PRIORITY]],...: tenants by header, "
                             "goodput compared per tenant")
    parser.add_argument("--seed", type=int, default=0,
                        help="the workload's seed, for both sides (default %(default)s)")
    parser.add_argument("--profile", default=PROFILE,
                        help="both sides' GPU profile or profile file (default %(default)s)")
    parser.add_argument("--max-model-len", type=int, default=MAX_MODEL_LEN,
                        help="both sides' context limit (default %(default)s)")
    parser.add_argument("--port", type=int, default=0,
                        help="the daemon's port (default 0: any free one)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{'workload':>11} {'qps':>5} {'goodput live':>13} {'simulated':>10} {'diff':>6} "
          f"{'req/s live':>11} {'sim':>6} {'TTFT p50 live':>14} {'sim':>6}")
    scheduler = ((["--chunk-size", str(args.chunk_size)] if args.chunk_size else [])
                 + (["--drop-expired"] if args.drop_expired else []))
    worst, rows = 0.0, []
    for point in args.points.split(","):
        workload, qps = point.split(":")
        live, sim, live_changes = check(args.layout, workload, float(qps), args.num_requests, out, args.port,
                          scheduler, args.tenant_mix, args.seed, args.profile,
                          args.max_model_len)
        diff = live.goodput_pct - sim.goodput_pct
        worst = max(worst, abs(diff))
        rows.append({"workload": workload, "qps": float(qps), "requests": args.num_requests,
                     "goodput_live_pct": live.goodput_pct, "goodput_sim_pct": sim.goodput_pct,
                     "throughput_live_rps": live.throughput_rps,
                     "throughput_sim_rps": sim.throughput_rps,
                     "ttft_p50_live_s": live.ttft_s.p50, "ttft_p50_sim_s": sim.ttft_s.p50,
                     "offloaded_live": live.offloaded, "offloaded_sim": sim.offloaded,
                     "dropped_live": live.dropped, "dropped_sim": sim.dropped,
                     "preemptions_live": [i["preemptions"] for i in live.per_instance],
                     "preemptions_sim": [i["preemptions"] for i in sim.per_instance],
                     "lost_live": live.lost, "lost_sim": sim.lost,
                     "role_changes_live": live_changes,
                     "role_changes_sim": sum(len(i.get("role_changes", []))
                                             for i in sim.per_instance),
                     "per_tenant": _per_tenant(live, sim)})
        print(f"{workload:>11} {float(qps):>5g} {live.goodput_pct:>12.1f}% {sim.goodput_pct:>9.1f}% "
              f"{diff:>+6.1f} {live.throughput_rps:>11.2f} {sim.throughput_rps:>6.2f} "
              f"{1000 * live.ttft_s.p50:>11.0f} ms {1000 * sim.ttft_s.p50:>4.0f} ms", flush=True)
        print(f"{'':>11} preemptions per instance: live {rows[-1]['preemptions_live']}, "
              f"simulated {rows[-1]['preemptions_sim']}", flush=True)
        row = rows[-1]
        print(f"{'':>11} lost: live {row['lost_live']}, simulated {row['lost_sim']}; role "
              f"changes: live {row['role_changes_live']}, simulated {row['role_changes_sim']}",
              flush=True)
        for line in _timeline(out / f"daemon_{args.layout}_{workload}.log"):
            print(f"{'':>11}   live: {line}", flush=True)
        for tenant in rows[-1]["per_tenant"]:
            worst = max(worst, abs(tenant["diff_points"]))
            print(f"{'':>11} tenant {tenant['tenant']}: goodput live {tenant['live_pct']:.1f}% "
                  f"simulated {tenant['sim_pct']:.1f}% ({tenant['diff_points']:+.1f}; "
                  f"{tenant['requests']} requests)", flush=True)
    print(f"largest goodput difference: {worst:.1f} points")
    (out / "summary.json").write_text(json.dumps(
        {"layout": args.layout, "scheduler": scheduler, "seed": args.seed, "rows": rows,
         "largest_difference_points": worst}, indent=1) + "\n")
    return 0


def _per_tenant(live, sim) -> list[dict]:
    """Goodput per tenant, live beside simulated (none without a tenant mix)."""
    simulated = {t.tenant: t for t in sim.per_tenant}
    return [{"tenant": t.tenant, "requests": t.num_requests, "live_pct": t.goodput_pct,
             "sim_pct": simulated[t.tenant].goodput_pct,
             "diff_points": t.goodput_pct - simulated[t.tenant].goodput_pct}
            for t in live.per_tenant if t.tenant in simulated]


if __name__ == "__main__":
    raise SystemExit(main())
