"""Offline throughput of one engine on the tiny model (CPU) vs Hugging Face `generate`.

The same prompts, output lengths, model and thread count go through our engine
(continuous batching over the paged KV cache) and through transformers' batched
`generate` (left-padded, one call per batch). Prints output tokens/s and the ratio
at each concurrency. Target: >= 3x at 16 concurrent requests.

    python -m bench.offline_throughput [--concurrency 1 4 16] [--max-tokens 64] [--threads 2]
"""
from __future__ import annotations

import argparse
import random
import time

import torch

from engines.engine import Engine
from engines.executors.torch_executor import TorchExecutor
from engines.models.builtin import builtin_tiny_model_dir
from engines.scheduler import SchedulerConfig
from ipc.params import SamplingParams


def workload(n: int, vocab: int, seed: int, lo: int = 32, hi: int = 128) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


def ours_tokens_per_s(model_dir, prompts, max_tokens: int, mode: str) -> float:
    engine = Engine(TorchExecutor(model_dir), SchedulerConfig(mode=mode, chunk_size=512))
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    engine.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    start = time.perf_counter()
    done = engine.generate(prompts, sampling)
    elapsed = time.perf_counter() - start
    return sum(len(c.token_ids) for c in done) / elapsed


def hf_tokens_per_s(model, prompts, max_tokens: int, pad_id: int) -> float:
    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    kwargs = dict(do_sample=False, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                  pad_token_id=pad_id)
    with torch.inference_mode():
        model.generate(input_ids=ids[:1, -8:], attention_mask=mask[:1, -8:],
                       **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        start = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        elapsed = time.perf_counter() - start
    return (out.shape[1] - width) * len(prompts) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: built-in tiny model)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mode", default="sarathi", choices=["sarathi", "vllm"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model_dir = args.model or builtin_tiny_model_dir()
    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vocab, pad_id = hf_model.config.vocab_size, hf_model.config.eos_token_id
    print(f"model {model_dir}, {args.threads} threads, {args.max_tokens} output tokens per request, "
          f"{args.mode} mode")
    print(f"{'requests':>8} {'ascendra tok/s':>15} {'HF generate tok/s':>18} {'ratio':>7}")
    for n in args.concurrency:
        prompts = workload(n, vocab, args.seed)
        ours = ours_tokens_per_s(model_dir, prompts, args.max_tokens, args.mode)
        theirs = hf_tokens_per_s(hf_model, prompts, args.max_tokens, pad_id)
        print(f"{n:>8} {ours:>15.1f} {theirs:>18.1f} {ours / theirs:>6.2f}x")


if __name__ == "__main__":
    main()
