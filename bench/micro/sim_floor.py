"""The floor under a faster simulator: what one `simulate` run would cost were its
per-token, per-block and naming work done in bulk, on columns (issue #26's 3x).

A sampling profile of the run (py-spy's raw format, self time per function) is grouped
by what each function does. The groups a columnar rewrite would replace -- the running
requests' per-token passes, the KV blocks' bookkeeping and the controller's prefix index,
the block names, the workload's prompts -- get their floor: the same work as numpy and
C-level container calls, timed here with no glue around them, times how often the run
does it. The other groups keep what they cost. The floor is generous to the rewrite (a
real one adds glue around those calls), so a target under it is out of reach of that
rewrite.

    pip install py-spy
    py-spy record -r 400 -f raw -o PROFILE -- python -m daemon.cli simulate \\
        --layout 2L1H --workload poisson --num-requests 4500 --qps 10.5 --seed 0
    python -m bench.micro.sim_floor PROFILE --baseline-cpu 18.1 -- \\
        --layout 2L1H --workload poisson --num-requests 4500 --qps 10.5 --seed 0

The flags after `--` are the run's (those of `ascendra simulate`). `--baseline-cpu`: the
CPU seconds of the run the target is a multiple of (the issue's commit, timed beside
this tree); the target is a third of it (`--speedup`).
"""
from __future__ import annotations

import argparse
import collections
import itertools
import resource
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

from bench.loadgen.workload import HIGH_TOKEN_ID, LOW_TOKEN_ID
from bench.loadgen.workloads import build_requests
from bench.ruler.ruler import sim_config
from bench.sim.sim_flags import add_sim_flags, sim_settings
from bench.sim.simulator import Simulation
from engines.gc_freeze import few_collections
from policies.prefix_hash import extend_block_hashes

#: What each group's functions are called (a py-spy frame's text contains one of these).
GROUPS: dict[str, tuple[str, ...]] = {
    "per-token passes": (
        "Scheduler.update ", "ControllerCore._tokens ", "RecordKeeper.tokens ",
        "_split_running", "_schedule_decodes", "queued_prefill.<locals>", "SimExecutor.tokens",
        "Batch.shape.<locals>", "add_decodes", "_decode_reserve", "Request.num_output_tokens",
        "step_time_allowed", "StepTokens.__post_init__"),
    "block names": ("_chain ", "token_bytes ", "block_hashes ", "chained_hash ",
                    "extend_block_hashes "),
    "KV blocks and prefix index": (
        "name_full_blocks", "_take_many", "BlockManager.free", "BlockManager._take ",
        "BlockManager.allocate", "BlockManager._lookup", "claim_prefix", "_Held.",
        "PrefixIndex."),
    "workload prompts": ("prompt_token_ids ", "request_prompt "),
}
REST = "the rest (kept as it is)"


def profile_shares(path: str) -> dict[str, float]:
    """Each group's share of a py-spy raw profile's samples, by the innermost frame."""
    counts: collections.Counter[str] = collections.Counter()
    with open(path) as lines:
        for line in lines:
            stack, _, n = line.rpartition(" ")
            frame = stack.rsplit(";", 1)[-1] + " "
            group = next((g for g, names in GROUPS.items() if any(s in frame for s in names)),
                         REST)
            counts[group] += int(n)
    total = sum(counts.values())
    return {g: counts[g] / total for g in [*GROUPS, REST]}


def seconds_each(work: Callable[[], object], repeat: int) -> float:
    """Median CPU seconds of one call, over 5 rounds of `repeat` calls."""
    rounds = []
    for _ in range(5):
        start = time.process_time()
        for _ in range(repeat):
            work()
        rounds.append((time.process_time() - start) / repeat)
    return float(np.median(rounds))


def columnar_step(num_decodes: int, block_size: int) -> Callable[[], None]:
    """One decode step's per-token passes on columns: which running requests decode,
    which open a block, the batch's context sum, the step's update and stop test, the
    controller's gaps between tokens, and the records' token times (one row per step)."""
    n = num_decodes
    num_computed = np.arange(1000, 1000 + n, dtype=np.int64)
    num_tokens, num_prompt = num_computed + 1, np.full(n, 500, dtype=np.int64)
    num_blocks = -(-num_tokens // block_size)
    max_total = np.full(n, 1 << 40, dtype=np.int64)
    last_token_time, step_log, clock = np.zeros(n), [], itertools.count()

    def step() -> None:
        now = float(next(clock))
        # the context sum, the finished rows and the gaps are what a real step passes on
        rows = np.flatnonzero((num_tokens - num_computed == 1) & (num_tokens > num_prompt))
        opening = rows[num_computed[rows] >= num_blocks[rows] * block_size]
        num_blocks[opening] += 1
        int(num_tokens[rows].sum())
        num_computed[rows] += 1
        num_tokens[rows] += 1
        rows[num_tokens[rows] >= max_total[rows]]
        now - last_token_time[rows]
        last_token_time[rows] = now
        step_log.append((now, rows))
    return step


def block_bookkeeping(num_blocks: int, held: int) -> Callable[[], None]:
    """A request's blocks in bulk: taken from the free list, named in the instance's
    map, recorded twice in the controller's index (sent, completed), then the oldest
    request's blocks forgotten in both and freed -- maps and free list kept at the
    instance's `held` blocks, as big as the run's (a map's size is its cache misses)."""
    requests = -(-held // num_blocks)
    pool = [i.to_bytes(16, "little") for i in range((requests + 1) * num_blocks)]
    batches = collections.deque(pool[i:i + num_blocks] for i in range(0, len(pool), num_blocks))
    free = list(range(len(pool)))
    refs = np.zeros(len(pool), dtype=np.int64)
    by_name: dict[bytes, int] = {}
    stamps: dict[bytes, int] = {}
    for names in itertools.islice(batches, requests):
        by_name.update(zip(names, range(len(names))))
        stamps.update(zip(names, itertools.repeat(0)))
    batches.rotate(-requests)

    def request() -> None:
        names = batches[0]
        blocks = free[-num_blocks:]
        del free[-num_blocks:]
        refs[blocks] = 1
        by_name.update(zip(names, blocks))
        stamps.update(zip(names, itertools.repeat(1)))
        stamps.update(zip(names, itertools.repeat(2)))
        batches.rotate(-1)
        for name in batches[0]:   # the oldest request's
            del stamps[name]
            del by_name[name]
        refs[blocks] = 0
        free.extend(reversed(blocks))
    return request


def run_counts(args: argparse.Namespace) -> dict[str, float]:
    """The run's instance steps, decodes, requests and full blocks (one in-process run)."""
    subject, config = sim_settings(args)
    requests = build_requests(config.workload, rate=args.qps, num_requests=args.num_requests,
                              seed=args.seed, max_model_len=config.max_model_len)
    simulation = Simulation(sim_config(subject, config), requests)
    with few_collections():
        records = simulation.run()
    block_size = simulation.instances[0].core.kv.block_size
    steps = sum(s.core.num_steps for s in simulation.instances)
    tokens = sum(len(r.token_times) for r in records)
    blocks = sum((r.prompt_len + len(r.token_times)) // block_size for r in records)
    return {"steps": steps, "decodes": tokens / steps, "requests": len(records),
            "blocks": blocks, "prompt_len": sum(r.prompt_len for r in records) / len(records),
            "block_size": block_size,
            "kv_blocks": simulation.instances[0].core.kv.num_blocks}


def run_cpu_seconds(argv: list[str]) -> float:
    """User + system CPU of the run as `ascendra simulate` (a child process: the profile's
    shares are of such a process, start-up included; `run_counts` needs the simulation's
    objects, so it runs it again in this one)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "daemon.cli", "simulate", *argv], check=True,
                   stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def floors(counts: dict[str, float]) -> dict[str, float]:
    """Each replaceable group's floor, in seconds of the run."""
    bs = int(counts["block_size"])
    n_blocks = max(1, int(counts["prompt_len"] // bs))   # a mean prompt's full blocks
    step = seconds_each(columnar_step(round(counts["decodes"]), bs), 2000)
    prompt = np.random.default_rng(0).integers(LOW_TOKEN_ID, HIGH_TOKEN_ID, n_blocks * bs)
    tokens = prompt.tolist()
    name = seconds_each(lambda: extend_block_hashes([], tokens, bs), 200) / n_blocks
    book = seconds_each(block_bookkeeping(n_blocks, int(counts["kv_blocks"])), 200) / n_blocks
    make_prompt = seconds_each(lambda: np.random.default_rng([0, 2, 7]).integers(
        LOW_TOKEN_ID, HIGH_TOKEN_ID, size=n_blocks * bs), 200)
    return {"per-token passes": step * counts["steps"],
            "block names": name * counts["blocks"],
            "KV blocks and prefix index": book * counts["blocks"],
            "workload prompts": make_prompt * counts["requests"]}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", help="py-spy record -f raw output of the run")
    parser.add_argument("--baseline-cpu", type=float, required=True,
                        help="CPU seconds of the run the target divides (the issue's commit)")
    parser.add_argument("--speedup", type=float, default=3.0)
    args = parser.parse_args(argv[:split])
    run_argv = argv[split + 1:]
    run = argparse.ArgumentParser(prog="simulate flags")
    add_sim_flags(run)
    run.add_argument("--num-requests", type=int, required=True)
    run.add_argument("--qps", type=float, required=True)
    run_args = run.parse_args(run_argv)
    cpu = run_cpu_seconds(run_argv)
    counts = run_counts(run_args)
    shares, floor = profile_shares(args.profile), floors(counts)
    print(f"run: {cpu:.2f} s CPU, {counts['steps']:,} instance steps of "
          f"{counts['decodes']:.0f} decodes on average, {counts['requests']:,} requests, "
          f"{counts['blocks']:,} full blocks")
    print(f"{'group':<28} {'share':>6} {'now s':>7} {'floor s':>8}")
    total = 0.0
    for group, share in shares.items():
        now = share * cpu
        low = floor.get(group, now)
        total += low
        print(f"{group:<28} {100 * share:5.1f}% {now:7.2f} {low:8.2f}")
    target = args.baseline_cpu / args.speedup
    print(f"floor {total:.2f} s CPU: {args.baseline_cpu / total:.2f}x the baseline's "
          f"{args.baseline_cpu:.1f} s at best; {args.speedup:g}x is {target:.2f} s "
          f"({'under' if target < total else 'over'} the floor)")


if __name__ == "__main__":
    main()
