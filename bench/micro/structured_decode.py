"""What grammar-constrained decoding costs, side by side with free decoding (tiny model, CPU).

Four measurements, each run in this one process (the TTFT one against a daemon it starts):

* steps: decode steps of B sequences, all free vs all under a JSON schema (their masks
  computed on the mask thread while the forward pass runs, engines/grammar.py), at each
  batch size; alternated A/B, so load on the machine hits both alike. Reported: wall time
  per step (median), process CPU time per step (all threads), and the ratio
  constrained / free of tokens per second (the target: >= 0.9 at batch 64).
* compile: the time to compile a schema (a fresh llguidance matcher), median of many.
* validity: N requests under a JSON schema with nested objects, arrays, enums and
  required fields; the share of those that end with `stop` whose text is valid JSON
  matching the schema (by `jsonschema`), and how many ended at max_tokens (`length`).
* ttft: a daemon (torch executor) under open-loop load at a fixed rate, half the requests
  constrained, half free, interleaved: p50/p99 time to first token of each.

    python -m bench.micro.structured_decode [--batches 1 16 64] [--steps 30] [--validity 200]
        [--ttft-requests 120 --rate 6]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time

import torch

from bench.micro.decode_step import run_step
from engines.executors.torch_executor import TorchExecutor
from engines.grammar import Grammars
from engines.models.builtin import builtin_tiny_model_dir
from engines.request import Request
from ipc.params import GrammarSpec, SamplingParams

#: Nested objects, arrays, enums, required fields; bounded so a reply can end.
SCHEMA = {"type": "object", "properties": {
    "kind": {"enum": ["cat", "dog", "fish"]},
    "name": {"type": "string", "maxLength": 8},
    "tags": {"type": "array", "items": {"enum": ["old", "new", "big"]}, "maxItems": 3},
    "owner": {"type": "object", "properties": {
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 8}},
        "required": ["age"], "additionalProperties": False}},
    "required": ["kind", "name", "owner"], "additionalProperties": False}
#: For the step timing: free text inside JSON strings, so requests stay in the grammar.
LONG_SCHEMA = {"type": "object", "properties": {"notes": {"type": "array",
                                                          "items": {"type": "string"}}},
               "required": ["notes"]}


def decoding_requests(executor, batch: int, context: int, headroom: int,
                      grammar: GrammarSpec | None) -> list[Request]:
    """`batch` prefilled requests (their first token sampled, under `grammar` if any)."""
    free = list(range(executor.num_kv_blocks))
    requests = []
    for i in range(batch):
        request = Request(f"r{i}", [3 + (7 * j + i) % 1000 for j in range(context)],
                          SamplingParams(max_tokens=headroom, ignore_eos=True, grammar=grammar,
                                         temperature=1.0, seed=i))
        blocks = -(-(context + headroom) // executor.block_size)
        request.block_table = [free.pop() for _ in range(blocks)]
        requests.append(request)
    run_step(executor, requests, {r.request_id: r.num_prompt_tokens for r in requests})
    return requests


def step_times(executor, batch: int, steps: int, rounds: int) -> dict[str, list[float]]:
    """Per-step (wall, cpu) seconds of free and constrained batches, alternated."""
    spec = GrammarSpec("json_schema", json.dumps(LONG_SCHEMA))
    times = {"free": [], "constrained": [], "free_cpu": [], "constrained_cpu": [], "inside": []}
    for _ in range(rounds):
        for kind in ("free", "constrained"):
            requests = decoding_requests(executor, batch, 32, steps + 4,
                                         spec if kind == "constrained" else None)
            run_step(executor, requests, {})  # caches warm
            for _ in range(steps):
                wall, cpu = time.perf_counter(), time.process_time()
                run_step(executor, requests, {})
                times[kind].append(time.perf_counter() - wall)
                times[f"{kind}_cpu"].append(time.process_time() - cpu)
            if kind == "constrained":  # those whose grammar is done cost little: say how many
                times["inside"].append(sum(not r.grammar_state.matcher.is_stopped()
                                           for r in requests) / batch)
    return times


def report_steps(executor, batches: list[int], steps: int, rounds: int) -> None:
    print(f"decode steps (tiny model, CPU, {torch.get_num_threads()} torch threads), "
          f"median of {steps * rounds} steps each, alternated free/constrained:")
    print("  batch | free ms/step | constrained ms/step | free cpu ms | constrained cpu ms |"
          " throughput ratio (wall) | (cpu) | still inside the grammar at the end")
    for batch in batches:
        times = step_times(executor, batch, steps, rounds)
        inside = min(times.pop("inside"))
        t = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"  {batch:5d} | {t['free']:12.2f} | {t['constrained']:19.2f} | "
              f"{t['free_cpu']:11.2f} | {t['constrained_cpu']:18.2f} | "
              f"{t['free'] / t['constrained']:23.2f} | "
              f"{t['free_cpu'] / t['constrained_cpu']:5.2f} |"
              f" {inside:.0%}")


def report_compile(executor, repeats: int = 50) -> None:
    grammars = Grammars(executor.grammars.tokenizer_json, executor.config.vocab_size,
                        executor.eos_token_ids, cache_size=1)
    specs = [GrammarSpec("json_schema", json.dumps({**SCHEMA, "title": f"s{i}"}))
             for i in range(repeats)]  # distinct: nothing comes from the cache
    times = []
    for spec in specs:
        start = time.perf_counter()
        grammars.check(spec)
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    Grammars(executor.grammars.tokenizer_json, executor.config.vocab_size,
             executor.eos_token_ids).tokenizer
    tokenizer = time.perf_counter() - start
    print(f"compile: schema median {statistics.median(times) * 1e3:.2f} ms, max "
          f"{max(times) * 1e3:.2f} ms over {repeats} distinct schemas; the tokenizer "
          f"(vocabulary {executor.config.vocab_size}) once per model {tokenizer * 1e3:.1f} ms")


def report_validity(executor, n: int, max_tokens: int) -> None:
    import jsonschema
    from engines.offline import Offline
    from engines.models.tokenizer import Tokenizer
    from engines.scheduler_config import SchedulerConfig
    tokenizer = Tokenizer(builtin_tiny_model_dir())
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA))
    engine = Offline(executor, SchedulerConfig(chunk_size=2048))
    done = engine.generate([tokenizer.encode(f"Pet {i} as JSON:") for i in range(n)],
                           [SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i,
                                           grammar=spec) for i in range(n)])
    stopped = [c for c in done if c.finish_reason == "stop"]
    valid = 0
    for c in stopped:
        try:
            jsonschema.validate(json.loads(tokenizer.decode(c.token_ids)), SCHEMA)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    length = sum(c.finish_reason == "length" for c in done)
    print(f"validity: {n} requests (temperature 1, seeds 0..{n - 1}, max_tokens {max_tokens}): "
          f"{len(stopped)} stop, {valid}/{len(stopped)} schema-valid "
          f"({valid / max(len(stopped), 1):.0%}); {length} ended by max_tokens (length)")


async def _ttft(session, url: str, body: dict) -> float:
    start = time.perf_counter()
    async with session.post(url, json=body) as response:
        async for line in response.content:
            if line.startswith(b"data: ") and b'"content"' in line:
                return time.perf_counter() - start
    raise RuntimeError(f"no token: {response.status}")


async def _load(base_url: str, n: int, rate: float) -> dict[str, list[float]]:
    import aiohttp
    url = base_url + "/v1/chat/completions"
    common = {"max_tokens": 16, "stream": True, "temperature": 1.0}
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA}}
    results: dict[str, list[float]] = {"free": [], "constrained": []}
    async with aiohttp.ClientSession() as session:
        async def one(i: int) -> None:
            kind = "constrained" if i % 2 else "free"
            body = {**common, "seed": i, "messages": [{"role": "user", "content": f"pet {i}"}],
                    **({"response_format": fmt} if i % 2 else {})}
            results[kind].append(await _ttft(session, url, body))
        tasks = []
        for i in range(n):
            tasks.append(asyncio.create_task(one(i)))
            await asyncio.sleep(1.0 / rate)
        await asyncio.gather(*tasks)
    return results


def report_ttft(n: int, rate: float) -> None:
    from bench.launch.daemon_launcher import launch
    with tempfile.TemporaryDirectory() as tmp:
        daemon = launch(["--executor", "torch", "--device", "cpu", "--num-kv-blocks", "1024"],
                        log_path=f"{tmp}/daemon.log")
        try:
            asyncio.run(_load(daemon.base_url, 4, 4.0))  # warm up
            results = asyncio.run(_load(daemon.base_url, n, rate))
        finally:
            daemon.stop()
    p = {k: (statistics.median(v), statistics.quantiles(v, n=100)[98]) for k, v in results.items()}
    print(f"ttft under load ({n} chat requests at {rate}/s, half constrained, interleaved; "
          f"max_tokens 16): free p50 {p['free'][0] * 1e3:.0f} ms p99 {p['free'][1] * 1e3:.0f} ms;"
          f" constrained p50 {p['constrained'][0] * 1e3:.0f} ms p99 "
          f"{p['constrained'][1] * 1e3:.0f} ms; p99 ratio {p['constrained'][1] / p['free'][1]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--validity", type=int, default=200, help="requests (0: skip)")
    parser.add_argument("--max-tokens", type=int, default=120)
    parser.add_argument("--ttft-requests", type=int, default=120, help="0: skip")
    parser.add_argument("--rate", type=float, default=6.0)
    parser.add_argument("--skip-steps", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    executor = TorchExecutor(builtin_tiny_model_dir(), device="cpu")
    if not args.skip_steps:
        report_steps(executor, args.batches, args.steps, args.rounds)
        report_compile(executor)
    if args.validity:
        report_validity(executor, args.validity, args.max_tokens)
    if args.ttft_requests:
        report_ttft(args.ttft_requests, args.rate)


if __name__ == "__main__":
    main()
