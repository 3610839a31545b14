"""Offline throughput of one engine on the tiny model (CPU) vs Hugging Face `generate`.

The same requests (prompt and output lengths), model and thread count go through our
engine -- continuous batching over the paged KV cache, at most C requests running --
and through transformers' batched `generate`, C requests per call (left-padded; a
call runs until its longest request is done, as static batching must). Counted
tokens are the ones each request asked for. Target: >= 3x at 16 concurrent requests.

Two workloads: `trace` -- lengths drawn from the ShareGPT trace in ../shared/traces,
divided by --scale to fit the tiny model's context; `uniform` -- every request has
the same prompt and output length (no padding or straggler waste for HF).

    python -m bench.offline_throughput [--concurrency 1 4 16] [--num-requests 64]
"""
from __future__ import annotations

import argparse
import random
import time

import torch

from bench.traces import load_trace, scaled_lengths
from engines.engine import Engine
from engines.executors.torch_executor import TorchExecutor
from engines.models.builtin import builtin_tiny_model_dir
from engines.scheduler import SchedulerConfig
from ipc.params import SamplingParams

Workload = list[tuple[list[int], int]]  # (prompt token ids, output tokens)


def make_workload(lengths: list[tuple[int, int]], vocab: int, seed: int) -> Workload:
    rng = random.Random(seed)
    return [([rng.randrange(3, vocab) for _ in range(p)], o) for p, o in lengths]


def ours_tokens_per_s(executor: TorchExecutor, work: Workload, concurrency: int) -> float:
    engine = Engine(executor, SchedulerConfig(mode="sarathi", chunk_size=512,
                                              max_num_seqs=concurrency))
    params = [SamplingParams(max_tokens=o, ignore_eos=True) for _, o in work]
    start = time.perf_counter()
    done = engine.generate([p for p, _ in work], params)
    elapsed = time.perf_counter() - start
    assert [len(c.token_ids) for c in done] == [o for _, o in work]
    return sum(o for _, o in work) / elapsed


def hf_generate(model, batch: Workload, pad_id: int) -> None:
    width = max(len(p) for p, _ in batch)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p, _ in batch])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
    longest = max(o for _, o in batch)
    model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=longest,
                   min_new_tokens=longest, pad_token_id=pad_id)


def hf_tokens_per_s(model, work: Workload, concurrency: int, pad_id: int) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(work), concurrency):
            hf_generate(model, work[i:i + concurrency], pad_id)
    return sum(o for _, o in work) / (time.perf_counter() - start)


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
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model_dir = args.model or builtin_tiny_model_dir()
    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    executor = TorchExecutor(model_dir, device="cpu")
    vocab, pad_id = hf_model.config.vocab_size, hf_model.config.eos_token_id
    warm = make_workload([(64, 8)] * 4, vocab, args.seed)
    ours_tokens_per_s(executor, warm, 4), hf_tokens_per_s(hf_model, warm, 4, pad_id)

    print(f"model {model_dir}\n{args.threads} threads, {args.num_requests} requests per run, "
          f"sarathi mode, chunk 512")
    for kind in args.workload:
        if kind == "trace":
            lengths = scaled_lengths(load_trace(args.trace), args.num_requests, args.scale,
                                     args.seed, executor.max_model_len)
            title = f"{args.trace} lengths / {args.scale:g}"
        else:
            lengths = [tuple(args.uniform_lengths)] * args.num_requests
            title = f"uniform: prompt {args.uniform_lengths[0]}, output {args.uniform_lengths[1]}"
        work = make_workload(lengths, vocab, args.seed)
        mean_p = sum(p for p, _ in lengths) / len(lengths)
        mean_o = sum(o for _, o in lengths) / len(lengths)
        print(f"\n{title} (mean prompt {mean_p:.0f}, mean output {mean_o:.0f} tokens)")
        print(f"{'concurrency':>11} {'ascendra tok/s':>15} {'HF generate tok/s':>18} {'ratio':>7}")
        for c in args.concurrency:
            ours = ours_tokens_per_s(executor, work, c)
            theirs = hf_tokens_per_s(hf_model, work, c, pad_id)
            print(f"{c:>11} {ours:>15.1f} {theirs:>18.1f} {ours / theirs:>6.2f}x")


if __name__ == "__main__":
    main()
