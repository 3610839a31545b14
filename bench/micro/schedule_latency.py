"""How long one `Scheduler.schedule()` call takes with a big queue, with and without a model.

Steady state of a busy instance: 256 running decodes and 2,000 waiting prompts.
Target: <= 0.5 ms per call (p50), and no call over 5 ms right after a refit.

Two set-ups per mode:

* `no model`: the scheduler alone, every request without a deadline (LP and HP still
  order the queue by value, with predictions of zero);
* `perf model` (LP and HP): the instance core as the simulator builds it -- the real `PerfModel`
  calibrated on the packaged GPU profile (`--profile`), fed each step's time and refitted
  as the core refits it (every `refit_every` steps) -- with TTFT deadlines drawn from the
  mixed-SLO classes, so value order, lost-request demotion and offloads all have work to
  do; the virtual clock advances by each step's profiled time, and every request that
  leaves the queue (offloaded) is replaced by a new arrival (`ARRIVAL_SPREAD`), so it
  stays 2,000 deep.
  `after refit` is the call right after each refit.

Every prompt is distinct random tokens (seeded): with prefix caching on (the default), a
queue of identical prompts would find each other's blocks cached -- no real queue does --
and price and admit its requests by those hits. The tokens are below 256, CPython's
cached small integers, so a prompt is a list of shared objects, as the identical prompts
were: the bench's own work between steps (new arrivals) stays as light as it was.

`--compare DIR` runs the same bench a second time on another checkout (e.g. a git
worktree of the commit before a change) and prints both side by side with the ratio.
`--clock cpu` times the calling thread's CPU time instead of wall time: steadier on a
machine busy with other work (a call that waits for a core is not counted as slow).

    python -m bench.micro.schedule_latency [--running 256] [--waiting 2000] [--iters 2000]
                                     [--clock wall|cpu] [--compare DIR] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

from bench.json_file import write_json
from bench.micro.side_by_side import CLOCKS, run_elsewhere
from engines.executors.latency import make_latency
from engines.executors.profiles.registry import get_profile
from engines.executors.sim_executor import SimExecutor
from engines.instance_core import InstanceCore
from engines.kv_cache import BlockManager
from engines.modes import role_of_mode
from engines.perf_setup import profile_perf_model
from engines.request import Request
from engines.scheduler import Scheduler
from engines.scheduler_config import SchedulerConfig
from ipc.params import SamplingParams

#: TTFT SLOs of the waiting prompts in the perf-model set-up (the mixed-slo classes:
#: interactive, standard, batch), drawn in these shares.
TTFT_SLOS = (0.5, 2.0, 30.0)
TTFT_SLO_SHARES = (0.3, 0.5, 0.2)
#: New arrivals arrived up to this many seconds before the step that first sees them (no
#: two at the same instant, as in real traffic).
ARRIVAL_SPREAD = 0.05
CHUNK_SIZE = 512
#: The clock the bench reads (`--clock`; bench/micro/side_by_side.py).
clock = CLOCKS["wall"]


def busy_scheduler(mode: str, running: int, waiting: int, seed: int = 0):
    """A bare scheduler with `running` decodes and `waiting` prompts, no deadlines."""
    rng = random.Random(seed)
    kv = BlockManager(num_blocks=running * 64 + 1024, block_size=16)
    scheduler = Scheduler(SchedulerConfig(mode=mode, chunk_size=CHUNK_SIZE, max_num_seqs=running),
                          kv, max_model_len=4096)
    _fill(scheduler, running, waiting, rng, lambda: timed_schedule(scheduler, 0.0))
    return scheduler


def prompt(rng: random.Random, low: int, high: int) -> list[int]:
    """A prompt of `rng.randrange(low, high)` random tokens in [0, 256)."""
    return list(rng.randbytes(rng.randrange(low, high)))


def _fill(scheduler, running: int, waiting: int, rng: random.Random, prefill) -> None:
    """Start `running` decodes (prefilling them with `prefill()` steps), then queue `waiting`
    (no deadlines)."""
    sampling = SamplingParams(max_tokens=10_000, ignore_eos=True)
    for i in range(running):
        scheduler.add_request(Request(f"r{i}", prompt(rng, 16, 512), sampling))
    while scheduler.waiting or any(not r.is_decoding for r in scheduler.running):
        prefill()
    for i in range(waiting):
        scheduler.add_request(Request(f"w{i}", prompt(rng, 16, 2048), sampling, i * 1e-3))


def timed_schedule(scheduler, now: float) -> float:
    """One schedule + update; returns the seconds schedule() alone took."""
    t0 = clock()
    batch = scheduler.schedule(now)
    elapsed = clock() - t0
    scheduler.update(batch, [7] * len(batch.sampling_chunks), now)
    return elapsed


class ModelBench:
    """An instance core as the simulator builds it (profile latency, calibrated `PerfModel`),
    stepped on a virtual clock with a queue kept `waiting` deep."""

    def __init__(self, mode: str, running: int, waiting: int, profile: str, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.now = 0.0
        self.waiting = waiting
        config = SchedulerConfig(mode=mode, chunk_size=CHUNK_SIZE, max_num_seqs=running)
        max_len = 8192
        blocks = running * (512 + 4096) // 16 + waiting * 2048 // 16
        self.executor = SimExecutor(make_latency(f"profile:{profile}"), num_kv_blocks=blocks,
                                    block_size=16, max_model_len=max_len)
        self.perf = profile_perf_model(get_profile(profile), config, max_len, blocks * 16)
        self.core = InstanceCore(0, role_of_mode(mode), self.executor, config, self.perf)
        self._ids = 0
        self.refits = 0
        self.perf.refit = self._counted(self.perf.refit)
        _fill(self.core.scheduler, running, 0, self.rng, self.step)
        self.top_up()

    def _counted(self, refit):
        """`refit`, counting its calls: the core refits the model inside `finish_step`."""
        def counted_refit():
            self.refits += 1
            return refit()
        return counted_refit

    def top_up(self) -> None:
        """New arrivals, each with a TTFT deadline, until `waiting` prompts wait again."""
        sampling = SamplingParams(max_tokens=10_000, ignore_eos=True)
        while len(self.core.scheduler.waiting) < self.waiting:
            self._ids += 1
            slo = self.rng.choices(TTFT_SLOS, TTFT_SLO_SHARES)[0]
            arrival = self.now - self.rng.uniform(0.0, ARRIVAL_SPREAD)
            self.core.scheduler.add_request(Request(
                f"n{self._ids}", prompt(self.rng, 16, 2048), sampling,
                arrival_time=arrival, deadline=arrival + slo))

    def step(self) -> tuple[float, bool]:
        """(seconds schedule() took, whether the model was refitted after it)."""
        refits = self.refits
        t0 = clock()
        batch, _ = self.core.begin_step(self.now)
        elapsed = clock() - t0
        seconds = self.executor.latency(batch)
        self.now += max(seconds, 1e-3)
        if batch:
            self.core.finish_step(batch, self.executor.tokens(batch), seconds, self.now)
        return elapsed, self.refits > refits


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    if not ordered:
        return {}
    return {"mean": statistics.fmean(ordered) * 1e3, "p50": ordered[len(ordered) // 2] * 1e3,
            "p99": ordered[int(len(ordered) * 0.99)] * 1e3, "max": ordered[-1] * 1e3,
            "n": len(ordered)}


def measure(running: int, waiting: int, iters: int, profile: str) -> dict[str, dict]:
    """{row label: summary in ms}: every mode without a model, LP and HP with one."""
    rows: dict[str, dict] = {}
    for mode in ("sarathi", "vllm", "lp", "hp"):
        scheduler = busy_scheduler(mode, running, waiting)
        rows[f"{mode} no model"] = summary([timed_schedule(scheduler, 1.0) for _ in range(iters)])
    for mode in ("lp", "hp"):
        bench = ModelBench(mode, running, waiting, profile)
        steady, after_refit, refit_next = [], [], False
        for _ in range(iters):
            elapsed, refits = bench.step()
            (after_refit if refit_next else steady).append(elapsed)
            refit_next = refits
            bench.top_up()
        rows[f"{mode} perf model"] = summary(steady + after_refit)
        rows[f"{mode} after refit"] = summary(after_refit)
    return rows



def _print_table(rows: dict[str, dict], other: dict[str, dict] | None, other_name: str) -> None:
    for label, row in rows.items():
        if not row:
            print(f"  {label:16s} (none in this run)")
            continue
        line = (f"  {label:16s} p50 {row['p50']:7.3f}  p99 {row['p99']:7.3f}  "
                f"max {row['max']:7.3f} ms  (n={row['n']})")
        if other and label in other and other[label]:
            was = other[label]
            line += (f"   | {other_name}: p50 {was['p50']:7.3f}  p99 {was['p99']:7.3f}  "
                     f"max {was['max']:7.3f} ms   p50 x{was['p50'] / row['p50']:.1f} faster")
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, default=256)
    parser.add_argument("--waiting", type=int, default=2000)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--profile", default="a100-llama3-8b")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--compare", type=Path, metavar="DIR",
                        help="another checkout to time the same way, side by side")
    parser.add_argument("--json", type=Path, metavar="OUT")
    parser.add_argument("--emit-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    rows = measure(args.running, args.waiting, args.iters, args.profile)
    if args.emit_json:
        json.dump(rows, sys.stdout)
        return
    flags = ["--running", str(args.running), "--waiting", str(args.waiting), "--iters",
             str(args.iters), "--profile", args.profile, "--clock", args.clock]
    other = run_elsewhere(__file__, args.compare, flags) if args.compare else None
    print(f"schedule() with {args.running} running and {args.waiting} waiting requests, "
          f"{args.iters} steps each, {args.clock} time "
          f"(target: p50 <= 0.5 ms; after a refit, max <= 5 ms)")
    _print_table(rows, other, str(args.compare) if args.compare else "")
    if args.json:
        config = {"running": args.running, "waiting": args.waiting, "iters": args.iters,
                  "profile": args.profile, "clock": args.clock, "compare": str(args.compare)}
        write_json(args.json, {"config": config, "this": rows, "compare": other})


if __name__ == "__main__":
    main()
