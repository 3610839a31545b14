"""A live run's steps (`serve --step-log`, engines/step_log.py) against a profile and
against each other: is a slower run the machine (the same batches taking longer) or the
queue (the same batch times, bigger batches)?

    python -m bench.profiling.step_log_study compare --profile p.json RUN.jsonl [RUN.jsonl ...]
    python -m bench.profiling.step_log_study to-profile --base p.json RUN.jsonl --out run.json
    python -m bench.profiling.step_log_study speed-trace --profile p.json RUN.jsonl --out t.json

`compare` prints, for each run: its steps, their mean size (sequences, decodes, prefill
tokens), the executor's mean time, how that compares with the profile's fit for the very
same batches (the sum of the executor's seconds over the sum of the fit's, and the median
step's ratio, overall and by sequences in the step), the thread's CPU over wall time of
the executor's calls; and, against the first run, the median execute time of each batch
composition both runs ran often enough (`--min-steps`): the same batches, each run's own
time for them.

`to-profile` writes a profile file whose steps are the run's own (each step its one
repetition, the executor's seconds), the base file's model, KV cache and host samples
kept: `ascendra simulate --profile run.json` on the same requests then prices every
batch as that run's executor ran it, in that minute (the loop closed given the steps).
The fit, on relative error, sits at a typical step, below the mean of noisy ones (3-8 %
on the runs of docs/measured_profiles.md); `--match-total` scales every step by the
run's summed seconds over the fit's summed prediction first, so that the fit charges
the run's total executor time. The base file's host samples are kept, and the host
costs are read off them against the new fit, as for any file -- so a run whose steps
were faster reads as a daemon with a costlier path, which hides part of the difference.
`--turn` avoids it: each step is the instance's whole turn (from its start to the next
step's, or to its own end when the instance then waited 1 ms or more: the scheduler,
the executor, the outputs sent, the commands taken; engines/step_log.py `turns`), and
the file's per-step host costs are zero (its `overhead`: the turns hold them), so the
simulator charges the run's turns and, of the base file's host costs, the per-request
one alone (read off its lone requests against the new fit; a base without host samples
gives none, and TTFT comes out short by it, a few ms).

`speed-trace` writes the run's speed against the profile's fit window by window
(`--window` seconds, 2 by default): `simulate --speed-trace FILE` replays it
(bench/sim/speed_trace.py).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import msgspec
import numpy as np

from engines.executors.profiles.measured import (
    MeasuredProfile, StepOverhead, TimedStep, load_measured, read_profile, write_profile,
)
from bench.sim.speed_trace import SpeedTrace, write_speed_trace
from engines.step_log import StepRecord, read_step_log, turns
from policies.batch_shape import BatchShape

#: Sequences a step runs, in the bins `compare` prints.
SIZE_BINS = ((1, 1), (2, 4), (5, 9), (10, 19), (20, 10**9))


def shape(record: StepRecord) -> BatchShape:
    return BatchShape.of(record.prefills, record.decodes)


def composition(record: StepRecord) -> tuple[int, int, int]:
    """A step's batch composition, coarsely: decodes, prefill tokens (to 32) and the
    decodes' summed context (to 256) -- steps with the same key cost about the same."""
    return (len(record.decodes), sum(c for c, _ in record.prefills) // 32,
            sum(record.decodes) // 256)


def speed(records: list[StepRecord], profile) -> float:
    """How slow the machine ran the run's steps against `profile`'s fit: the executor's
    summed seconds over the fit's summed prediction for the very same batches (1: as
    the profile says; 1.1: everything 10 % slower)."""
    return (sum(r.execute_s for r in records)
            / sum(profile.step_time(shape(r)) for r in records))


def speed_trace(records: list[StepRecord], profile, window_s: float) -> SpeedTrace:
    """The run's `speed` in each `window_s` from its first step (a window without steps,
    the instance idle, keeps the one before; the first such, 1)."""
    sums: dict[int, list[float]] = {}
    for record in records:
        window = int((record.start - records[0].start) // window_s)
        spent = sums.setdefault(window, [0.0, 0.0])
        spent[0] += record.execute_s
        spent[1] += profile.step_time(shape(record))
    factors, last = [], 1.0
    for window in range(max(sums) + 1):
        if window in sums and sums[window][1] > 0:
            last = sums[window][0] / sums[window][1]
        factors.append(last)
    return SpeedTrace(window_s=window_s, factors=factors)


def summary(records: list[StepRecord], profile) -> dict:
    """One run's steps against `profile`'s fit."""
    execute = np.array([r.execute_s for r in records])
    fit = np.array([profile.step_time(shape(r)) for r in records])
    seqs = np.array([len(r.decodes) + len(r.prefills) for r in records])
    ratio = execute / fit
    by_size = {f"{lo}-{hi}" if hi < 10**9 else f"{lo}+":
               round(float(execute[m].sum() / fit[m].sum()), 3)
               for lo, hi in SIZE_BINS if (m := (seqs >= lo) & (seqs <= hi)).any()}
    return {"steps": len(records),
            "seconds": round(records[-1].start - records[0].start, 2),
            "mean_seqs": round(float(seqs.mean()), 2),
            "mean_decodes": round(statistics.fmean(len(r.decodes) for r in records), 2),
            "mean_prefill_tokens": round(statistics.fmean(
                sum(c for c, _ in r.prefills) for r in records), 1),
            "mean_execute_ms": round(1e3 * float(execute.mean()), 3),
            "execute_over_fit": round(speed(records, profile), 3),
            "median_step_over_fit": round(float(np.median(ratio)), 3),
            "by_sequences_over_fit": by_size,
            "cpu_over_wall": round(sum(r.cpu_s for r in records) / float(execute.sum()), 3),
            "busy_share": round(sum(r.core_s + r.execute_s + r.finish_s for r in records)
                                / max(1e-9, records[-1].start - records[0].start), 3)}


def paired(first: list[StepRecord], other: list[StepRecord], min_steps: int) -> dict:
    """The other run's median execute time over the first's, batch composition by
    composition (those each ran at least `min_steps` times): the median ratio, and the
    ratio of the two runs' summed medians weighted by the first run's counts."""
    a, b = defaultdict(list), defaultdict(list)
    for r in first:
        a[composition(r)].append(r.execute_s)
    for r in other:
        b[composition(r)].append(r.execute_s)
    keys = [k for k in a if len(a[k]) >= min_steps and len(b.get(k, ())) >= min_steps]
    if not keys:
        return {"compositions": 0}
    ratios = [statistics.median(b[k]) / statistics.median(a[k]) for k in keys]
    weight = {k: len(a[k]) for k in keys}
    weighted = (sum(weight[k] * statistics.median(b[k]) for k in keys)
                / sum(weight[k] * statistics.median(a[k]) for k in keys))
    covered = sum(weight.values()) / len(first)
    return {"compositions": len(keys), "first_run_steps_covered": round(covered, 3),
            "median_ratio": round(statistics.median(ratios), 3),
            "weighted_ratio": round(weighted, 3)}


def kind(record: StepRecord) -> str:
    if record.prefills:
        return "mixed" if record.decodes else "prefill"
    return "spread" if len(set(record.decodes)) > 1 else "decode"


def run_profile(base_path: str, records: list[StepRecord], match_total: bool = False,
                turn: bool = False):
    """The base file with the run's steps as its grid (a `ProfileFile`); `match_total`:
    each step scaled so that the fit's summed prediction is the run's summed seconds;
    `turn`: each step the instance's whole turn, and no per-step host costs."""
    base = read_profile(base_path)
    seconds = turns(records) if turn else [r.execute_s for r in records]
    steps = [TimedStep(kind=kind(r), prefills=[tuple(p) for p in r.prefills],
                       decodes=list(r.decodes), seconds=[t]) for r, t in zip(records, seconds)]
    overhead = [StepOverhead(1, 0.0, 1)] if turn and base.host else base.overhead
    profile = msgspec.structs.replace(base, steps=steps, repeats=1, overhead=overhead)
    if not match_total:
        return profile
    fitted = MeasuredProfile("", profile)
    scale = sum(seconds) / sum(fitted.step_time(shape(r)) for r in records)
    return msgspec.structs.replace(profile, steps=[
        msgspec.structs.replace(s, seconds=[scale * x for x in s.seconds]) for s in steps])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profiling.step_log_study",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    compare = verbs.add_parser("compare", help="runs' steps against a profile and each other")
    compare.add_argument("--profile", required=True)
    compare.add_argument("--min-steps", type=int, default=20)
    compare.add_argument("runs", nargs="+", help="step logs (steps-N.jsonl)")
    to_profile = verbs.add_parser("to-profile", help="a profile file of a run's own steps")
    to_profile.add_argument("--base", required=True, help="the profile file to take the rest from")
    to_profile.add_argument("--out", required=True)
    to_profile.add_argument("--match-total", action="store_true",
                            help="scale the steps so the fit charges the run's total time")
    to_profile.add_argument("--turn", action="store_true",
                            help="each step the instance's whole turn; no per-step host costs")
    to_profile.add_argument("run", help="a step log (steps-N.jsonl)")
    trace = verbs.add_parser("speed-trace", help="a run's speed window by window, for "
                                                 "`simulate --speed-trace`")
    trace.add_argument("--profile", required=True)
    trace.add_argument("--window", type=float, default=2.0, help="seconds (default 2)")
    trace.add_argument("--out", required=True)
    trace.add_argument("run", help="a step log (steps-N.jsonl)")
    args = parser.parse_args(argv)
    try:
        if args.verb == "speed-trace":
            if not args.window > 0:
                raise ValueError(f"--window must be > 0, got {args.window}")
            made = speed_trace(read_step_log(args.run), load_measured(args.profile),
                               args.window)
            write_speed_trace(args.out, made)
            print(f"wrote {args.out}: {len(made.factors)} windows of {args.window:g} s, "
                  f"{min(made.factors):.2f}-{max(made.factors):.2f}x the profile's time")
            return 0
        if args.verb == "to-profile":
            write_profile(args.out, run_profile(args.base, read_step_log(args.run),
                                                args.match_total, args.turn))
            profile = load_measured(args.out)
            print(f"wrote {args.out}: {len(profile.data.steps)} steps, fit off by "
                  f"{100 * profile.fit_mape:.1f} % on average")
            return 0
        profile = load_measured(args.profile)
        runs = [(path, read_step_log(path)) for path in args.runs]
        for i, (path, records) in enumerate(runs):
            row = {"run": path, **summary(records, profile)}
            if i:
                row["against_first_run"] = paired(runs[0][1], records, args.min_steps)
            print(msgspec.json.encode(row).decode(), flush=True)
    except ValueError as exc:
        print(f"step_log_study: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
