"""Offline throughput of one engine on the tiny model (CPU) vs Hugging Face `generate`.

The same requests (prompt and output lengths), model and thread count go through our
engine -- continuous batching over the paged KV cache, at most C requests running --
and through transformers' batched `generate`, C requests per call (left-padded; a
call runs until its longest request is done, as static batching must). Counted
tokens are the ones each request asked for. Target: >= 3x at 16 concurrent requests,
on both workloads.

Two workloads: `trace` -- lengths drawn from the packaged ShareGPT trace (bench/data/trace_data),
divided by --scale to fit the tiny model's context; `uniform` -- every request has
the same prompt and output length (no padding or straggler waste for HF).

On `uniform` HF wastes nothing, so all a serving engine can gain there is the framework's
own time around the model's matrix products. `--bound` measures how far that goes: our
run once more under torch.profiler, its matrix products' own time summed (the same
products HF computes, on the same BLAS); tokens over that time is the speed of an
executor whose every other op and line of Python took no time, printed as a ratio to HF.

Timings on a shared machine are noisy, so each (workload, concurrency) runs --repeats
pairs, ours and HF's back to back (the order alternating), and reports min / median / max
tokens/s of each and of the per-pair ratio. `--clock cpu` times with the process's CPU
time instead of the wall clock: steadier when other jobs share the cores (with one
thread it is what an idle machine would show).

    python -m bench.micro.offline_throughput [--concurrency 1 4 16] [--workload trace uniform]
                                       [--repeats 3] [--threads 2] [--clock wall] [--bound]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch

from bench.loadgen.trace_file import load_trace
from bench.loadgen.traces import scaled_lengths
from bench.micro.decode_step import MATMUL_OPS
from engines.executors.torch_executor import TorchExecutor
from engines.models.builtin import builtin_tiny_model_dir
from engines.offline import Offline
from engines.scheduler import SchedulerConfig
from ipc.params import SamplingParams

Workload = list[tuple[list[int], int]]  # (prompt token ids, output tokens)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
CHUNK_SIZE = 512


def make_workload(lengths: list[tuple[int, int]], vocab: int, seed: int) -> Workload:
    rng = random.Random(seed)
    return [([rng.randrange(3, vocab) for _ in range(p)], o) for p, o in lengths]


def ours_tokens_per_s(executor: TorchExecutor, work: Workload, concurrency: int,
                      clock=time.perf_counter) -> float:
    offline = Offline(executor, SchedulerConfig(mode="sarathi", chunk_size=CHUNK_SIZE,
                                                max_num_seqs=concurrency))
    params = [SamplingParams(max_tokens=o, ignore_eos=True) for _, o in work]
    start = clock()
    done = offline.generate([p for p, _ in work], params)
    elapsed = clock() - start
    assert [len(c.token_ids) for c in done] == [o for _, o in work]
    return sum(o for _, o in work) / elapsed


def matmul_bound_tokens_per_s(executor: TorchExecutor, work: Workload, concurrency: int) -> float:
    """Tokens/s of our run if only its matrix products took time (see the module doc)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ours_tokens_per_s(executor, work, concurrency)
    seconds = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in MATMUL_OPS) / 1e6
    return sum(o for _, o in work) / seconds


def hf_generate(model, batch: Workload, pad_id: int) -> None:
    width = max(len(p) for p, _ in batch)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p, _ in batch])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
    longest = max(o for _, o in batch)
    model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=longest,
                   min_new_tokens=longest, pad_token_id=pad_id)


def hf_tokens_per_s(model, work: Workload, concurrency: int, pad_id: int,
                    clock=time.perf_counter) -> float:
    start = clock()
    with torch.inference_mode():
        for i in range(0, len(work), concurrency):
            hf_generate(model, work[i:i + concurrency], pad_id)
    return sum(o for _, o in work) / (clock() - start)


def spread(values: list[float], unit: str = "") -> str:
    """'median [min-max]' of a list of measurements."""
    return (f"{statistics.median(values):.2f}{unit} "
            f"[{min(values):.2f}-{max(values):.2f}]")


def measure(run_ours, run_hf, repeats: int) -> tuple[list[float], list[float], list[float]]:
    """`repeats` back-to-back pairs, alternating who goes first: ours, HF, ratios."""
    ours, theirs = [], []
    for i in range(repeats):
        if i % 2:
            theirs.append(run_hf())
            ours.append(run_ours())
        else:
            ours.append(run_ours())
            theirs.append(run_hf())
    return ours, theirs, [a / b for a, b in zip(ours, theirs)]


def workload_lengths(kind: str, args, max_model_len: int) -> tuple[str, list[tuple[int, int]]]:
    if kind == "trace":
        lengths = scaled_lengths(load_trace(args.trace), args.num_requests, args.scale,
                                 args.seed, max_model_len)
        return f"{args.trace} lengths / {args.scale:g}", lengths
    prompt, output = args.uniform_lengths
    return f"uniform {prompt}+{output}", [(prompt, output)] * args.num_requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: built-in tiny model)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--workload", nargs="+", choices=["trace", "uniform"],
                        default=["trace", "uniform"])
    parser.add_argument("--trace", default="sharegpt", choices=["sharegpt", "arxiv"])
    parser.add_argument("--scale", type=float, default=8.0, help="divide trace lengths by this")
    parser.add_argument("--uniform-lengths", type=int, nargs=2, default=[96, 64],
                        metavar=("PROMPT", "OUTPUT"))
    parser.add_argument("--repeats", type=int, default=3, help="paired runs per measurement")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="cpu: process CPU time (sums threads: meant for --threads 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bound", action="store_true",
                        help="also print the matrix-products-only bound, as a ratio to HF")
    args = parser.parse_args()

    import transformers
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    clock = CLOCKS[args.clock]
    model_dir = args.model or builtin_tiny_model_dir()
    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    executor = TorchExecutor(model_dir, device="cpu")
    vocab, pad_id = hf_model.config.vocab_size, hf_model.config.eos_token_id
    warm = make_workload([(64, 8)] * 4, vocab, args.seed)
    ours_tokens_per_s(executor, warm, 4), hf_tokens_per_s(hf_model, warm, 4, pad_id)

    print(f"model {model_dir}\ntorch {torch.__version__}, transformers {transformers.__version__},"
          f" {args.threads} threads on {os.cpu_count()} cores, {args.clock} clock\n"
          f"{args.num_requests} requests per run, sarathi mode, chunk {CHUNK_SIZE}, "
          f"{args.repeats} paired runs per row (tokens/s and ratio: median [min-max])")
    ratios: dict[tuple[str, int], str] = {}
    titles = []
    for kind in args.workload:
        title, lengths = workload_lengths(kind, args, executor.max_model_len)
        titles.append(title)
        work = make_workload(lengths, vocab, args.seed)
        mean_p = sum(p for p, _ in lengths) / len(lengths)
        mean_o = sum(o for _, o in lengths) / len(lengths)
        print(f"\n{title} (mean prompt {mean_p:.0f}, mean output {mean_o:.0f} tokens)")
        print(f"{'concurrency':>11}  {'ascendra tok/s':>24}  {'HF generate tok/s':>24}  ratio")
        for c in args.concurrency:
            ours, theirs, ratio = measure(
                lambda c=c, work=work: ours_tokens_per_s(executor, work, c, clock),
                lambda c=c, work=work: hf_tokens_per_s(hf_model, work, c, pad_id, clock),
                args.repeats)
            ratios[title, c] = spread(ratio, "x")
            print(f"{c:>11}  {spread(ours):>24}  {spread(theirs):>24}  {ratios[title, c]}",
                  flush=True)
            if args.bound:
                bound = matmul_bound_tokens_per_s(executor, work, c)
                print(f"{'':>11}  bound (matrix products alone): {bound:.0f} tok/s, "
                      f"{bound / statistics.median(theirs):.2f}x HF", flush=True)

    print("\nratio to HF generate, median [min-max], side by side")
    print(f"{'concurrency':>11}" + "".join(f"  {t:>26}" for t in titles))
    for c in args.concurrency:
        print(f"{c:>11}" + "".join(f"  {ratios[t, c]:>26}" for t in titles))


if __name__ == "__main__":
    main()
