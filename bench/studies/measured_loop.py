"""The loop closed on this machine: a live daemon with one torch instance under the real
load generator, against `ascendra simulate --profile FILE` (the same machine's executor,
profiled by `ascendra profile`) on the same requests, at a few rates.

    python -m bench.studies.measured_loop --profile tiny-cpu.json [--rates 0.5,1.5]
        [--num-requests 60] [--max-prompt-len 128] [--model DIR] [--out DIR]
        [--instances 2] [--torch-threads 1]
    python -m bench.studies.measured_loop --rounds 4 --capacity-fractions 0.5,0.85
        --num-requests 400 [--out DIR]

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

`--rounds K` is the check for a machine whose speed wanders from minute to minute (this
2-core VM: docs/measured_profiles.md), where one profile is one look at it. The loop
times its own profiles (`ascendra profile` on the loop's settings, over contexts up to
the served `--max-model-len` unless `--profile-max-model-len` says otherwise): one before
the first round and one after each. A round runs every rate live once, with step logs (ascending
in odd rounds, descending in even ones, so no rate always comes first after a profile).
Then each live run is simulated four ways: `before`, on the profile timed just before
its round (the one-profile check); `around`, on the two timed around its round joined as
one file (bench/profiling/profile_blend.py: each step's repetitions from both minutes);
`minute`, on `around` scaled by the run's own speed against `around`'s fit, read off its
step log (bench/profiling/step_log_study.py `speed`): the machine's minute taken out, one
number taken from the live side; and `seconds`, on `around` at the run's speed in each
half second (`simulate --speed-trace`, bench/sim/speed_trace.py): the machine's seconds
replayed, a diagnostic of what the rest of the simulation gets right. For each rate it prints every round, and the mean and
standard deviation over the rounds of the live side and of each simulation, with whether
the simulation's means are within the targets of `TARGETS` (goodput within 3 points;
p50 and p90 TTFT and mean TBT within 10 %). `--capacity-fractions` sets the rates as
shares of the capacity the first profile simulates (`ascendra capacity`, Poisson,
600 measured requests, seed `--seed`), decided before any live run.
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

#: How close the simulation must come to the live side: goodput in points, the rest
#: relative to the live figure (the issue's targets).
GOODPUT_POINTS = 3.0
TARGETS = {"p50_ttft_s": 0.10, "p90_ttft_s": 0.10, "mean_tbt_s": 0.10}
#: The figures compared, as each side's result file gives them.
FIGURES = ("goodput_pct", *TARGETS)
#: The simulations of an interleaved run: the profile before it, the two around its
#: round joined, those scaled to the run's own speed, and those at its speed each
#: `SPEED_WINDOW_S` (a replay of the machine's seconds).
SIDES = ("before", "around", "minute", "seconds")
SPEED_WINDOW_S = 0.5


def _shared(args) -> list[str]:
    """Flags both the daemon and the simulator take."""
    return ["--layout", f"{args.instances}xsarathi", "--max-model-len", str(args.max_model_len),
            "--chunk-size", str(args.chunk_size), "--max-num-seqs", str(args.max_num_seqs),
            "--num-kv-blocks", str(args.num_kv_blocks), "--ttft-slo", str(args.ttft_slo),
            "--tbt-slo", str(args.tbt_slo)]


def _load(args, rate: float) -> list[str]:
    return ["--workload", "poisson", "--qps", f"{rate:g}", "--num-requests",
            str(args.num_requests), "--seed", str(args.seed),
            "--max-prompt-len", str(args.max_prompt_len)]


def live(args, rate: float, out: Path, step_log: bool) -> dict:
    """One live run at `rate`: the daemon under `ascendra bench`; the load average and
    the hypervisor's steal over it. Writes `live_<rate>.json` and its records in `out`."""
    serve = ["--executor", "torch", "--device", "cpu", *_shared(args),
             "--torch-threads", str(args.torch_threads),
             *(["--model", args.model] if args.model else []),
             *(["--step-log", str(out / f"steps_{rate:g}")] if step_log else []),
             "--max-queued-requests", "100000", "--max-queued-tokens", "1000000000"]
    out.mkdir(parents=True, exist_ok=True)
    with ServeProcess(serve, start_timeout=300, log_path=out / f"daemon_{rate:g}.log") as daemon:
        load_before, cpu_before = os.getloadavg()[0], cpu_times()
        subprocess.run([sys.executable, "-m", "daemon.cli", "bench", "--url", daemon.url,
                        *_load(args, rate), "--max-model-len", str(args.max_model_len),
                        "--json", str(out / f"live_{rate:g}.json"),
                        "--records", str(out / f"live_{rate:g}.records.jsonl"),
                        "--disable-tqdm", "--max-error-rate", "1"],
                       check=True, stdout=subprocess.DEVNULL)
        load_after, cpu_after = os.getloadavg()[0], cpu_times()
    return {"rate": rate, "load_live": [round(load_before, 2), round(load_after, 2)],
            "steal_pct_live": steal_pct(cpu_before, cpu_after)}


def simulate(args, rate: float, profile: str | Path, out: Path, side: str,
             speed_trace: Path | None = None) -> dict:
    """The same requests simulated on `profile` (at the speeds of `speed_trace`, if
    given); its figures. Writes `<side>_<rate>.json` and its records in `out`."""
    subprocess.run([sys.executable, "-m", "daemon.cli", "simulate", *_shared(args),
                    *_load(args, rate), "--profile", str(profile),
                    *(["--speed-trace", str(speed_trace)] if speed_trace else []),
                    "--json", str(out / f"{side}_{rate:g}.json"),
                    "--records", str(out / f"{side}_{rate:g}.records.jsonl")],
                   check=True, stdout=subprocess.DEVNULL)
    return figures(out / f"{side}_{rate:g}.json")


def figures(result_json: Path) -> dict:
    result = read_result(result_json)
    return {"goodput_pct": round(result.goodput_pct, 1), "p50_ttft_s": result.ttft_s.p50,
            "p90_ttft_s": result.ttft_s.p90, "mean_tbt_s": result.mean_tbt_s.mean,
            "completed": result.completed}


def check(args, rate: float, out: Path) -> dict:
    """The one-profile check at `rate`: live, then simulated on `--profile`."""
    row = live(args, rate, out, args.step_log)
    sides = {"live": figures(out / f"live_{rate:g}.json"),
             "sim": simulate(args, rate, args.profile, out, "sim")}
    row.update({f"{k}_{side}": v for side, got in sides.items() for k, v in got.items()})
    if args.instances > 1:
        for side in sides:
            row[f"by_instance_{side}"] = by_instance(out / f"{side}_{rate:g}.records.jsonl")
    return row


def interleaved(args, out: Path) -> list[dict]:
    """`--rounds`: profiles timed around rounds of live runs, then every run simulated
    on the profile before it, the two around it, and those at its own speed (the run's
    and each half second's)."""
    profiles = [time_profile(args, out / "profile-0.json")]
    rates = rates_for(args, profiles[0], out)
    print(f"rates {', '.join(f'{r:g}' for r in rates)} req/s", flush=True)
    runs = []
    for k in range(1, args.rounds + 1):
        for rate in (rates if k % 2 else rates[::-1]):
            runs.append((k, live(args, rate, out / f"round-{k}", step_log=True)))
            print(f"round {k}: live at {rate:g} req/s done", flush=True)
        profiles.append(time_profile(args, out / f"profile-{k}.json"))
    arounds = {k: joined(profiles[k - 1], profiles[k], out / f"round-{k}")
               for k in range(1, args.rounds + 1)}
    return [simulated_round(args, k, row, profiles[k - 1], arounds[k], out / f"round-{k}")
            for k, row in runs]


def simulated_again(out: Path, args) -> list[dict]:
    """`--again`: the live runs and profiles an earlier `--rounds` left in `out`,
    simulated again (the live figures as they were)."""
    try:
        earlier = json.loads((out / "summary.json").read_text())["runs"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"measured_loop: --again needs an earlier --rounds run's "
                         f"{out / 'summary.json'}: {exc}") from None
    keep = ("rate", "load_live", "steal_pct_live")
    arounds = {k: joined(out / f"profile-{k - 1}.json", out / f"profile-{k}.json",
                         out / f"round-{k}") for k in {row["round"] for row in earlier}}
    return [simulated_round(args, row["round"], {k: row[k] for k in keep},
                            out / f"profile-{row['round'] - 1}.json", arounds[row["round"]],
                            out / f"round-{row['round']}")
            for row in earlier]


def joined(before: Path, after: Path, out: Path) -> Path:
    """The two profiles around a round as one file, `out/around.json`
    (bench/profiling/profile_blend.py `join`)."""
    from bench.profiling.profile_blend import join
    from engines.executors.profiles.measured import read_profile, write_profile
    around = out / "around.json"
    write_profile(around, join([(str(p), read_profile(p)) for p in (before, after)]))
    return around


def simulated_round(args, k: int, row: dict, before: Path, around: Path, out: Path) -> dict:
    """A live run of round `k` (its `live` row) beside its four simulations: on the
    profile `before` its round, on the two `around` it joined, and those at its speed."""
    from bench.profiling.profile_blend import scale
    from bench.profiling.step_log_study import speed, speed_trace
    from bench.sim.speed_trace import write_speed_trace
    from engines.executors.profiles.measured import write_profile
    from engines.step_log import read_step_log
    rate = row["rate"]
    fitted = load_measured(around)
    steps = sorted((r for log in (out / f"steps_{rate:g}").glob("steps-*.jsonl")
                    for r in read_step_log(log)), key=lambda r: r.start)
    factor = speed(steps, fitted)
    minute = out / f"minute_{rate:g}.json"
    write_profile(minute, scale(fitted.data, factor))
    trace = out / f"seconds_{rate:g}.trace.json"
    write_speed_trace(trace, speed_trace(steps, fitted, SPEED_WINDOW_S))
    sides = {"live": figures(out / f"live_{rate:g}.json"),
             "before": simulate(args, rate, before, out, "before"),
             "around": simulate(args, rate, around, out, "around"),
             "minute": simulate(args, rate, minute, out, "minute"),
             "seconds": simulate(args, rate, around, out, "seconds", speed_trace=trace)}
    return {"round": k, **row, "speed": round(factor, 4), **sides}


def time_profile(args, path: Path) -> Path:
    """`ascendra profile` on the loop's executor settings, into `path`."""
    subprocess.run([sys.executable, "-m", "daemon.cli", "profile", "--device", "cpu",
                    "--repeats", str(args.repeats), "--chunk-size", str(args.chunk_size),
                    "--max-num-seqs", str(args.max_num_seqs),
                    "--max-model-len", str(args.profile_max_model_len),
                    "--num-kv-blocks", str(args.num_kv_blocks),
                    "--torch-threads", str(args.torch_threads),
                    *(["--model", args.model] if args.model else []), "--out", str(path)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"timed {path}", flush=True)
    return path


def rates_for(args, profile: Path, out: Path) -> list[float]:
    """`--rates`, or `--capacity-fractions` of the capacity `profile` simulates."""
    if not args.capacity_fractions:
        return [float(r) for r in args.rates.split(",")]
    answer = out / "capacity.json"
    subprocess.run([sys.executable, "-m", "daemon.cli", "capacity", *_shared(args),
                    "--profile", str(profile), "--workload", "poisson",
                    "--max-prompt-len", str(args.max_prompt_len), "--measured", "600",
                    "--seeds", str(args.seed), "--tolerance", "0.05", "--json", str(answer)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    capacity = json.loads(answer.read_text())["mean_qps"]
    print(f"capacity on {profile}: {capacity:g} req/s", flush=True)
    return [round(float(f) * capacity, 2) for f in args.capacity_fractions.split(",")]


def aggregate(rows: list[dict]) -> list[dict]:
    """For each rate: each figure's mean and sd over the rounds, live and simulated, each
    simulation's error against the live mean, and whether it is within the targets."""
    out = []
    for rate in sorted({r["rate"] for r in rows}):
        runs = [r for r in rows if r["rate"] == rate]
        entry = {"rate": rate, "rounds": len(runs),
                 "speed": spread([r["speed"] for r in runs])}
        for side in ("live", *SIDES):
            entry[side] = {k: spread([r[side][k] for r in runs]) for k in FIGURES}
        for side in SIDES:
            entry[f"{side}_error"] = errors(entry["live"], entry[side])
            entry[f"{side}_within"] = within(entry[f"{side}_error"])
        out.append(entry)
    return out


def spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else 0.0}


def errors(live_side: dict, sim_side: dict) -> dict:
    """Goodput's difference in points; each other figure's relative to the live mean."""
    live_mean = {k: v["mean"] for k, v in live_side.items()}
    sim_mean = {k: v["mean"] for k, v in sim_side.items()}
    return {"goodput_pct": round(sim_mean["goodput_pct"] - live_mean["goodput_pct"], 2),
            **{k: round(sim_mean[k] / live_mean[k] - 1, 4) for k in TARGETS}}


def within(error: dict) -> bool:
    return (abs(error["goodput_pct"]) <= GOODPUT_POINTS
            and all(abs(error[k]) <= limit for k, limit in TARGETS.items()))


def report(rows: list[dict], summary: list[dict]) -> str:
    """The interleaved check as a person reads it (milliseconds)."""
    def ms(x: float) -> str:
        return f"{1e3 * x:.2f}"
    lines = []
    for entry in summary:
        rate = entry["rate"]
        lines.append(f"rate {rate:g} req/s, {entry['rounds']} rounds; the run's speed against "
                     f"`around` {entry['speed']['mean']:.3f} +- {entry['speed']['sd']:.3f}")
        lines.append("  round  side     goodput %  p50 TTFT ms  p90 TTFT ms  mean TBT ms")
        for row in (r for r in rows if r["rate"] == rate):
            for side in ("live", *SIDES):
                got = row[side]
                lines.append(f"  {row['round']:>5}  {side:<7}  {got['goodput_pct']:>9.1f}  "
                             f"{ms(got['p50_ttft_s']):>11}  {ms(got['p90_ttft_s']):>11}  "
                             f"{ms(got['mean_tbt_s']):>11}")
        for side in ("live", *SIDES):
            got = entry[side]
            cells = [f"{got['goodput_pct']['mean']:.1f} +- {got['goodput_pct']['sd']:.1f}"] + [
                f"{ms(got[k]['mean'])} +- {ms(got[k]['sd'])}" for k in TARGETS]
            line = f"  mean   {side:<7}  " + "  ".join(cells)
            if side != "live":
                error = entry[f"{side}_error"]
                line += (f"   error {error['goodput_pct']:+.1f} pt, "
                         + ", ".join(f"{100 * error[k]:+.1f} %" for k in TARGETS)
                         + ("  within" if entry[f"{side}_within"] else "  NOT within"))
            lines.append(line)
    return "\n".join(lines)


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
    parser.add_argument("--profile", help="the file `ascendra profile` wrote (the "
                                          "one-profile check; not with --rounds)")
    parser.add_argument("--rounds", type=int, default=0,
                        help="the interleaved check: this many rounds, the loop timing its "
                             "own profiles around each")
    parser.add_argument("--model", default=None, help="the profiled model (default: tiny)")
    parser.add_argument("--rates", default="0.5,1.5", help="requests/s, comma-separated")
    parser.add_argument("--capacity-fractions", default="",
                        help="with --rounds: rates as these shares of the capacity the first "
                             "profile simulates (e.g. 0.5,0.85), instead of --rates")
    parser.add_argument("--num-requests", type=int, default=60)
    parser.add_argument("--max-model-len", type=int, default=256)
    parser.add_argument("--chunk-size", type=int, default=512)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--num-kv-blocks", type=int, default=None,
                        help="KV cache blocks of both sides (default: the profile's; with "
                             "--rounds 2048)")
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
                        help="each live instance records its steps in <out>/steps_<rate>/ "
                             "(--rounds always does)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="with --rounds: each profile's passes over its grid")
    parser.add_argument("--profile-max-model-len", type=int, default=None,
                        help="with --rounds: the longest context each profile times "
                             "(default: --max-model-len, what the daemon serves)")
    parser.add_argument("--again", action="store_true",
                        help="with --rounds: simulate again the live runs and profiles an "
                             "earlier run left in --out (after a change to the simulator); "
                             "the same flags as that run")
    parser.add_argument("--out", default="measured_loop")
    args = parser.parse_args(argv)
    if bool(args.profile) == bool(args.rounds > 0):
        parser.error("give either --profile FILE (one profile) or --rounds K (interleaved)")
    if (args.capacity_fractions or args.again) and not args.rounds:
        parser.error("--capacity-fractions and --again go with --rounds")
    args.profile_max_model_len = args.profile_max_model_len or args.max_model_len
    if args.num_kv_blocks is None:
        args.num_kv_blocks = (load_measured(args.profile).data.num_kv_blocks
                              if args.profile else 2048)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.rounds:
        rows = simulated_again(out, args) if args.again else interleaved(args, out)
        summary = aggregate(rows)
        (out / "summary.json").write_text(json.dumps(
            {"runs": rows, "by_rate": summary}, indent=2) + "\n")
        text = report(rows, summary)
        (out / "report.txt").write_text(text + "\n")
        print(text)
        return 0
    rows = []
    for rate in (float(r) for r in args.rates.split(",")):
        row = check(args, rate, out)
        rows.append(row)
        print(json.dumps(row), flush=True)
    (out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
