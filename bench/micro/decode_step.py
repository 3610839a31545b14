"""One decode step of the torch executor on the tiny model (CPU): aten ops and time.

N sequences (their context lengths given, cycled) are prefilled, then decoded one token
per step. Reports the aten ops of one step -- as a TorchDispatchMode sees them (the
calls the model makes) and as torch.profiler records them (with the ops those call) --,
the matrix products' share of the ops' time, and min / median thread time of a step,
which other jobs on the machine disturb less than the wall clock does.

    python -m bench.micro.decode_step [--contexts 96] [--num-seqs 16] [--steps 100] [--threads 1]
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from engines.batch import Batch
from engines.executors.torch_executor import TorchExecutor
from engines.models.builtin import builtin_tiny_model_dir
from engines.request import Request
from ipc.params import SamplingParams


# The model's linear layers and LM head: the work any implementation must do, the rest of
# a step (attention, norms, small ops, Python) is what an executor can cut.
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm")


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def decoding_requests(executor: TorchExecutor, contexts: list[int], num_seqs: int,
                      headroom: int) -> list[Request]:
    """`num_seqs` prefilled requests with room for `headroom` more tokens each."""
    free = list(range(executor.num_kv_blocks))
    requests = []
    for i in range(num_seqs):
        n = contexts[i % len(contexts)]
        request = Request(f"r{i}", [3 + (7 * j + i) % 1000 for j in range(n)],
                          SamplingParams(max_tokens=headroom, ignore_eos=True))
        request.block_table = [free.pop() for _ in range(-(-(n + headroom) // executor.block_size))]
        requests.append(request)
    run_step(executor, requests, {r.request_id: r.num_prompt_tokens for r in requests})
    return requests


def run_step(executor: TorchExecutor, requests: list[Request], sizes: dict[str, int]) -> None:
    batch = Batch()
    for request in requests:
        batch.add(request, sizes.get(request.request_id, 1))
    for chunk, token in zip(batch.chunks, executor.execute(batch)):
        chunk.request.num_computed_tokens += chunk.num_tokens
        chunk.request.token_ids.append(token)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[96])
    parser.add_argument("--num-seqs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    executor = TorchExecutor(builtin_tiny_model_dir(), device="cpu")
    requests = decoding_requests(executor, args.contexts, args.num_seqs, args.steps + 20)

    def step() -> None:
        run_step(executor, requests, {})

    for _ in range(3):
        step()
    with OpCounter() as counter:
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            step()
    nested = sum(1 for e in prof.events() if e.name.startswith("aten::")) / 5
    self_time = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    matmul = sum(self_time.get(op, 0.0) for op in MATMUL_OPS) / sum(self_time.values())
    times = []
    for _ in range(args.steps):
        start = time.thread_time()
        step()
        times.append(time.thread_time() - start)
    print(f"{args.num_seqs} sequences, contexts {args.contexts}, {args.threads} thread(s)")
    print(f"aten ops per decode step: {sum(counter.ops.values())} called by the model, "
          f"{nested:.0f} with the ops they call (profiler)")
    print("most called:", ", ".join(f"{name} {n}" for name, n in counter.ops.most_common(8)))
    print(f"matrix products' share of the ops' self time (profiler): {matmul:.0%}")
    print(f"step thread time: min {min(times) * 1e3:.2f} ms, "
          f"median {statistics.median(times) * 1e3:.2f} ms over {args.steps} steps")


if __name__ == "__main__":
    main()
