"""The live phase of `ascendra profile`: the daemon's own path timed on the profiled
executor, so that the simulator can add what that path costs beyond the executor's steps.

A real daemon (`ascendra serve`, one instance of the profiled executor, mode sarathi, the
profile's KV cache, chunk and sequence limits) is started, and the load generator of
`ascendra bench` (the same client) sends it groups of `batch` requests at once -- a
prompt of `prompt_len` tokens of its own each (no prefix is shared: nothing is cached),
`output_len` tokens asked -- `repeats` groups of each batch size (of a lone request
`LONE_REPEATS` at least), after one untimed group, each group once the one before has
ended (one client session a group: its connections are new, as a load generator's
first ones are). Each group's time to first token and mean time between tokens per
request is a `HostSample`
(engines/executors/profiles/measured.py). The daemon keeps a step log (`serve
--step-log`, engines/step_log.py) meanwhile: each step's whole turn less the executor's
call is the instance's own time for it, whose median by the step's sequences is a
`StepOverhead`. The per-step costs are fitted to those, the per-request cost read off the
lone requests' TTFT.
"""
from __future__ import annotations

import asyncio
import statistics
import tempfile
from pathlib import Path

from bench.launch.daemon_launcher import ServeProcess
from bench.loadgen.loadgen import run_load
from bench.loadgen.workload import WorkloadRequest
from engines.executors.profiles.measured import HostSample, StepOverhead
from engines.step_log import StepRecord, read_step_log, turns

#: A request's prompt and output (tokens): short, so that steps are the host's smallest.
PROMPT_LEN = 16
OUTPUT_LEN = 32
#: Lone requests timed at least (the per-request cost is their median).
LONE_REPEATS = 10
#: Seconds a group may take to be answered (a tiny model's group takes well under one).
GROUP_TIMEOUT_S = 120.0


def host_batches(max_num_seqs: int, chunk_size: int, prompt_len: int = PROMPT_LEN) -> list[int]:
    """1, 2, 4, ... up to the sequence limit and to what one chunk prefills at once."""
    top = min(max_num_seqs, max(1, chunk_size // prompt_len))
    batches, b = [], 1
    while b <= top:
        batches.append(b)
        b *= 2
    return batches


def serve_args(model_dir: str, device: str, block_size: int, num_kv_blocks: int,
               max_model_len: int, chunk_size: int, max_num_seqs: int,
               tp: int = 1, torch_threads: int = 0) -> list[str]:
    """The daemon that runs the profiled executor as one instance (over `tp` ranks, on
    `torch_threads` threads each: 0 = torch's default)."""
    return ["--executor", "torch", "--device", device, "--model", model_dir, "--tp", str(tp),
            "--torch-threads", str(torch_threads),
            "--layout", "1xsarathi", "--block-size", str(block_size),
            "--num-kv-blocks", str(num_kv_blocks), "--max-model-len", str(max_model_len),
            "--chunk-size", str(chunk_size), "--max-num-seqs", str(max_num_seqs)]


def host_plan(batches: list[int], repeats: int) -> list[int]:
    """The groups' sizes in order: one untimed lone request (a warm-up), then `repeats`
    groups of each size, of a lone request `LONE_REPEATS` at least (the cost of a request
    is read off lone requests alone: one slow answer must not be their median)."""
    return [1] + [b for b in batches
                  for _ in range(max(repeats, LONE_REPEATS) if b == 1 else repeats)]


def time_host(args: list[str], batches: list[int], repeats: int,
              prompt_len: int = PROMPT_LEN, output_len: int = OUTPUT_LEN,
              progress=None) -> tuple[list[HostSample], list[StepOverhead]]:
    """Start a daemon with `args` (serve_args), time `repeats` groups of each batch size
    through it, end it; one sample per group, and the instance's own time a step by the
    step's sequences. `progress()` after each group."""
    plan = host_plan(batches, repeats)
    with tempfile.TemporaryDirectory(prefix="ascendra-host-") as logs:
        with ServeProcess([*args, "--step-log", logs], start_timeout=300) as daemon:
            groups = asyncio.run(_send_groups(daemon.url, plan, prompt_len, output_len,
                                              progress))
        records = [r for log in sorted(Path(logs).glob("steps-*.jsonl"))
                   for r in read_step_log(log)]
    samples = [HostSample(len(group), prompt_len, output_len, [r.ttft() for r in group],
                          [r.mean_tbt() for r in group]) for group in groups[1:]]
    return samples, step_overheads(records)


def step_overheads(records: list[StepRecord]) -> list[StepOverhead]:
    """The instance's own time around the executor (the step's turn less its call), the
    median by the step's sequences."""
    by_size: dict[int, list[float]] = {}
    for record, turn in zip(records, turns(records)):
        size = len(record.prefills) + len(record.decodes)
        by_size.setdefault(size, []).append(max(0.0, turn - record.execute_s))
    return [StepOverhead(n, statistics.median(v), len(v)) for n, v in sorted(by_size.items())]


async def _send_groups(url: str, plan: list[int], prompt_len: int, output_len: int,
                       progress) -> list[list]:
    """Each group's requests sent at once, the next group once this one has ended."""
    groups, index = [], 0
    for number, batch in enumerate(plan):
        workload = [WorkloadRequest(index=index + i, arrival=0.0, prompt_len=prompt_len,
                                    output_len=output_len) for i in range(batch)]
        index += batch
        run = await run_load(url, workload, progress=False, timeout=GROUP_TIMEOUT_S)
        _check(run.records, number, output_len)
        groups.append(sorted(run.records, key=lambda r: r.index))
        if progress is not None:
            progress()
    return groups


def _check(records, group: int, output_len: int) -> None:
    """Every request of the group answered in full."""
    for record in records:
        if record.outcome != "completed" or record.num_output_tokens not in (None, output_len):
            raise ValueError(f"host timing: request {record.index} of group {group} was "
                             f"not answered in full ({record.outcome}: {record.error})")
