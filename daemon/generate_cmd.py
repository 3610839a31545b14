"""`ascendra generate`: offline generation of several prompts with one in-process instance
(engines/offline.py: the instance core's offline driver)."""
from __future__ import annotations

import argparse
import json
import time

from daemon.config import InstancesConfig
from engines.models.builtin import builtin_tiny_model_dir
from engines.models.tokenizer import Tokenizer
from engines.modes import BASELINES
from engines.offline import Offline
from engines.scheduler import SchedulerConfig
from ipc.params import SamplingParams


def add_arguments(p: argparse.ArgumentParser) -> None:
    sampling, scheduler = SamplingParams(), SchedulerConfig()
    p.add_argument("--model", help="Hugging Face model folder (default: the built-in tiny model)")
    p.add_argument("--mode", choices=[*BASELINES, "lp", "hp"], default=scheduler.mode,
                   help="the scheduler's mode (default: %(default)s)")
    p.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for more")
    p.add_argument("--max-tokens", type=int, default=sampling.max_tokens,
                   help="tokens to generate per prompt (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=sampling.temperature,
                   help="0 = greedy (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=sampling.top_p,
                   help="nucleus sampling's probability mass (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=sampling.top_k,
                   help="sample among the k likeliest tokens; 0 = no cut (default: %(default)s)")
    p.add_argument("--seed", type=int, default=None,
                   help="sampling seed, per request (default: none)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="generate --max-tokens even past the end-of-sequence token")
    p.add_argument("--chunk-size", type=int, default=scheduler.chunk_size,
                   help="token budget of one step (default: %(default)s)")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="most requests in a batch (default: the mode's)")
    p.add_argument("--block-size", type=int, default=InstancesConfig().block_size,
                   help="KV cache block size in tokens (default: %(default)s)")
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help="KV cache size in blocks (default: what the device's memory holds)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--tp", type=int, default=InstancesConfig().tp,
                   help="tensor-parallel degree: the model runs over this many ranks, one "
                        "process (and GPU) each (default: %(default)s)")
    p.add_argument("--json", action="store_true",
                   help="print JSON Lines: one object per prompt (prompt, prompt_token_ids, "
                        "token_ids, text, finish_reason)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from engines.executors.build import build_executor
    from engines.executors.executor_config import ExecutorConfig
    sampling = SamplingParams.create(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, seed=args.seed, ignore_eos=args.ignore_eos)
    config = SchedulerConfig(mode=args.mode, chunk_size=args.chunk_size,
                             max_num_seqs=args.max_num_seqs)
    model_dir = args.model or builtin_tiny_model_dir()
    tokenizer = Tokenizer(model_dir)
    # torch only in build_executor: every other `ascendra` command (serve's controller) runs
    # without it
    executor = build_executor(ExecutorConfig(
        kind="torch", model_dir=str(model_dir), block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks, device=args.device or "", tp=args.tp))
    try:
        offline = Offline(executor, config)
        prompts = [tokenizer.encode(text) for text in args.prompt]
        start = time.perf_counter()
        completions = offline.generate(prompts, sampling)
        elapsed = time.perf_counter() - start
    finally:
        if executor.ranks is not None:
            executor.ranks.stop()
    results = [
        {"prompt": text, "prompt_token_ids": c.prompt_token_ids, "token_ids": c.token_ids,
         "text": tokenizer.decode(c.token_ids), "finish_reason": c.finish_reason}
        for text, c in zip(args.prompt, completions)
    ]
    if args.json:
        for r in results:
            print(json.dumps(r, ensure_ascii=False))
        return 0
    for r in results:
        print(f"--- {r['prompt']!r} ({len(r['token_ids'])} tokens, {r['finish_reason']})")
        print(r["text"])
    total = sum(len(c.token_ids) for c in completions)
    prompts = f"{len(results)} prompt" + ("s" if len(results) != 1 else "")
    print(f"--- {prompts}, {total} tokens in {elapsed:.2f} s "
          f"({total / max(elapsed, 1e-9):.1f} tokens/s, {args.mode} mode"
          f"{f', tp {args.tp}' if args.tp > 1 else ''})")
    return 0
