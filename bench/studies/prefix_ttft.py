"""Prefix caching on the real executor: TTFT of short questions after a shared system
prompt, with caching and without, side by side.

Two offline instances (engines/offline.py) over two torch executors of the same model (default: the built-in tiny
model, on CPU), one with prefix caching and one without, get the same requests in
turn: each request is a 1,000-token system prompt and a short question of its own, sent
alone (no queueing: its TTFT is its prefill step) to one instance, then to the other, so
any slowdown of the machine falls on both alike. The first request of each instance (the
one that fills the cache) is reported apart and left out of the ratio.

    python -m bench.studies.prefix_ttft [--requests 30] [--system-prompt-len 1000]
        [--question-len 16,48] [--model DIR] [--json OUT]
"""
from __future__ import annotations

import argparse
import statistics
import time

import msgspec
import numpy as np

from bench.json_file import write_json
from bench.loadgen.workload import HIGH_TOKEN_ID, LOW_TOKEN_ID
from engines.executors.torch_executor import TorchExecutor
from engines.offline import Offline
from engines.scheduler_config import SchedulerConfig
from ipc.params import SamplingParams


class TtftSide(msgspec.Struct, kw_only=True):
    prefix_caching: bool
    first_ttft_s: float          # the first request (caching: it fills the cache)
    median_ttft_s: float         # the rest
    mean_ttft_s: float
    cached_prompt_pct: float     # share of the rest's prompt tokens found cached


class PrefixTtft(msgspec.Struct, kw_only=True):
    model: str
    requests: int
    system_prompt_len: int
    question_len: tuple[int, int]
    caching: TtftSide
    no_caching: TtftSide
    median_ratio: float          # caching's median TTFT / no caching's
    mean_ratio: float


def _ttft(offline: Offline, prompt: list[int], request_id: str) -> tuple[float, int]:
    """Seconds from submit to the first token of `prompt`, alone on `offline`; and the
    prompt tokens it found cached."""
    start = time.perf_counter()
    request = offline.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True),
                                  request_id=request_id)
    while offline.core.has_work:
        offline.step()
    return time.perf_counter() - start, request.num_cached_tokens or 0


def _side(caching: bool, times: list[float], cached: list[int], prompts: list[list[int]]
          ) -> TtftSide:
    rest = times[1:]
    return TtftSide(prefix_caching=caching, first_ttft_s=round(times[0], 5),
                    median_ttft_s=round(statistics.median(rest), 5),
                    mean_ttft_s=round(statistics.fmean(rest), 5),
                    cached_prompt_pct=round(100 * sum(cached[1:])
                                            / sum(len(p) for p in prompts[1:]), 2))


def prefix_ttft(model: str, requests: int = 30, system_prompt_len: int = 1000,
                question_len: tuple[int, int] = (16, 48), seed: int = 0,
                num_kv_blocks: int = 1024, threads: int | None = None) -> PrefixTtft:
    if requests < 2:
        raise ValueError("need at least 2 requests: the first only fills the cache")
    rng = np.random.default_rng(seed)
    system = rng.integers(LOW_TOKEN_ID, HIGH_TOKEN_ID, size=system_prompt_len).tolist()
    prompts = [system + rng.integers(LOW_TOKEN_ID, HIGH_TOKEN_ID, size=int(rng.integers(
        question_len[0], question_len[1] + 1))).tolist() for _ in range(requests)]
    engines = {caching: Offline(TorchExecutor(model, num_kv_blocks=num_kv_blocks, device="cpu",
                                              num_threads=threads),
                                SchedulerConfig(prefix_caching=caching))
               for caching in (True, False)}
    times = {True: [], False: []}
    cached = {True: [], False: []}
    for i, prompt in enumerate(prompts):
        for caching, offline in engines.items():
            seconds, hit = _ttft(offline, prompt, f"r{i}")
            times[caching].append(seconds)
            cached[caching].append(hit)
    on, off = (_side(c, times[c], cached[c], prompts) for c in (True, False))
    return PrefixTtft(model=str(model), requests=requests, system_prompt_len=system_prompt_len,
                      question_len=question_len, caching=on, no_caching=off,
                      median_ratio=round(on.median_ttft_s / off.median_ttft_s, 4),
                      mean_ratio=round(on.mean_ttft_s / off.mean_ttft_s, 4))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.prefix_ttft",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: the built-in tiny model)")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--system-prompt-len", type=int, default=1000)
    parser.add_argument("--question-len", default="16,48", metavar="LO,HI")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--json", help="write the result (PrefixTtft) here")
    args = parser.parse_args(argv)
    model = args.model
    if model is None:
        from engines.models.builtin import builtin_tiny_model_dir
        model = builtin_tiny_model_dir()
    lo, hi = (int(x) for x in args.question_len.split(","))
    result = prefix_ttft(model, args.requests, args.system_prompt_len, (lo, hi),
                         threads=args.threads)
    for side in (result.caching, result.no_caching):
        print(f"prefix caching {'on ' if side.prefix_caching else 'off'}: TTFT median "
              f"{1000 * side.median_ttft_s:.2f} ms, mean {1000 * side.mean_ttft_s:.2f} ms "
              f"(first request {1000 * side.first_ttft_s:.2f} ms); "
              f"{side.cached_prompt_pct:.1f} % of prompt tokens cached")
    print(f"TTFT with caching / without: median {result.median_ratio:.3f}x, "
          f"mean {result.mean_ratio:.3f}x ({result.requests - 1} requests after the first, "
          f"{result.system_prompt_len}-token system prompt, questions of "
          f"{lo}-{hi} tokens)")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
