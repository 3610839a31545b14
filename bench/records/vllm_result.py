"""A run's result in `vllm bench serve`'s JSON (`--save-result`), so the scripts and
dashboards that read vLLM's files read ours.

Field names and meanings follow vLLM 0.33.0's `vllm/benchmarks/serve.py` (read from its
wheel): per request `input_lens`, `output_lens`, `ttfts`, `itls`, `latencies`,
`start_times`, `generated_texts`, `errors` (only with --save-detailed, as vLLM); per run
`completed`, `failed`, `request_throughput`, `request_goodput` (None without
--goodput), the token throughputs, `max_output_tokens_per_s`, `max_concurrent_requests`;
and for each metric of `--percentile-metrics` (ms) `mean_*`, `median_*`, `std_*` and one
`p<P>_*` per `--metric-percentiles`. As vLLM: a completed request's TPOT is (latency -
TTFT) / (output tokens - 1), over requests with more than one token; ITL is every gap
between streamed chunks; a failed request (ours: dropped, errored or lost) has TTFT 0,
no ITLs and 0 output tokens, and counts in `failed`. Goodput counts completed requests
within every target given (`ttft`, `tpot`, `e2el`, ms; a one-token request's TPOT is 0),
per second of the run. Texts are not kept by `ascendra bench`: `generated_texts` holds
empty strings.
"""
from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

import msgspec
import numpy as np

from bench.records.schema import RequestRecord

#: The metrics `--percentile-metrics` may name (vLLM's, less its client-queue ones, which
#: it reports only under --max-concurrency), and the default.
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILE_METRICS = "ttft,tpot,itl"
DEFAULT_METRIC_PERCENTILES = "99"
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
#: Fields vLLM leaves out without --save-detailed (too many data points).
DETAILED = ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts",
            "errors")


def parse_goodput(pairs: list[str]) -> dict[str, float]:
    """`ttft:500 tpot:50 e2el:2000` -> {"ttft": 500.0, ...} (ms); ValueError naming the
    pair for anything else."""
    targets = {}
    for pair in pairs:
        name, sep, value = pair.partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = math.nan
        if not sep or name not in GOODPUT_METRICS or not (math.isfinite(ms) and ms >= 0):
            raise ValueError(f"--goodput {pair!r}: give KEY:MS pairs with KEY one of "
                             f"{', '.join(GOODPUT_METRICS)} and MS a number >= 0")
        targets[name] = ms
    return targets


def parse_percentile_metrics(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in PERCENTILE_METRICS]
    if bad or not names:
        raise ValueError(f"--percentile-metrics {text!r}: choose from "
                         f"{','.join(PERCENTILE_METRICS)}")
    return names


def parse_metric_percentiles(text: str) -> list[float]:
    try:
        values = [float(p) for p in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(0 < p < 100 or p == 100 for p in values):
        raise ValueError(f"--metric-percentiles {text!r}: comma-separated percentiles in "
                         "(0, 100], e.g. 50,90,99")
    return values


def _tpot(r: RequestRecord) -> float:
    n = r.output_tokens()
    return (r.end_time - r.first_token_time) / (n - 1) if n > 1 else 0.0


def _good(r: RequestRecord, goodput: dict[str, float]) -> bool:
    measured = {"ttft": r.ttft(), "tpot": _tpot(r), "e2el": r.end_time - r.arrival}
    return all(measured[name] <= ms / 1000 for name, ms in goodput.items())


def _peaks(done: list[RequestRecord]) -> tuple[float, int]:
    """vLLM's `max_output_tokens_per_s` and `max_concurrent_requests`: the most chunks in
    one second of the run, and the most requests active in one second."""
    if not done:
        return 0.0, 0
    start = min(r.arrival for r in done)
    seconds = int(np.ceil(max(r.end_time for r in done) - start)) + 1
    tokens, active = np.zeros(seconds), np.zeros(seconds)
    for r in done:
        for t in r.token_times:
            tokens[int(t - start)] += 1
        active[int(r.arrival - start):int(r.end_time - start) + 1] += 1
    return float(tokens.max()), int(active.max())


def _stats(result: dict, name: str, values: list[float], percentiles: list[float]) -> None:
    data = np.asarray(values or [0.0]) * 1000   # vLLM: statistics of [0] when empty
    result[f"mean_{name}_ms"] = float(data.mean())
    result[f"median_{name}_ms"] = float(np.median(data))
    result[f"std_{name}_ms"] = float(data.std())
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        result[f"p{word}_{name}_ms"] = float(np.percentile(data, p))


def vllm_result(records: list[RequestRecord], duration_s: float, *, backend: str, model: str,
                num_prompts: int, request_rate: float, burstiness: float,
                max_concurrency: int | None, goodput: dict[str, float],
                percentile_metrics: list[str], metric_percentiles: list[float],
                detailed: bool = False, label: str | None = None) -> dict:
    """The JSON object `vllm bench serve --save-result` writes, for these records (in
    their order; warm-up requests left out)."""
    records = [r for r in records if not r.warmup]
    done = [r for r in records if r.outcome == "completed" and r.first_token_time is not None
            and r.end_time is not None]
    ok = {id(r) for r in done}
    out_lens = [r.output_tokens() if id(r) in ok else 0 for r in records]
    total_in = sum(r.prompt_len for r in done)
    total_out = sum(out_lens)
    rate = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: 0.0)
    peak_tokens, peak_requests = _peaks(done)
    result = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"), "endpoint_type": backend,
        "backend": backend, "label": label, "model_id": model, "tokenizer_id": model,
        "num_prompts": num_prompts,
        "request_rate": request_rate if math.isfinite(request_rate) else "inf",
        "burstiness": burstiness, "max_concurrency": max_concurrency,
        "duration": duration_s, "completed": len(done), "failed": len(records) - len(done),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": rate(len(done)),
        "request_goodput": rate(sum(_good(r, goodput) for r in done)) if goodput else None,
        "output_throughput": rate(total_out), "total_token_throughput": rate(total_in + total_out),
        "input_lens": [r.prompt_len for r in records], "output_lens": out_lens,
        "ttfts": [r.ttft() if id(r) in ok else 0.0 for r in records],
        "itls": [np.diff(r.token_times).tolist() if id(r) in ok else [] for r in records],
        "latencies": [r.end_time - r.arrival if id(r) in ok else 0.0 for r in records],
        "start_times": [r.arrival for r in records],
        "generated_texts": ["" for _ in records],
        "errors": ["" if id(r) in ok else (r.error or r.outcome) for r in records],
        "max_output_tokens_per_s": peak_tokens, "max_concurrent_requests": peak_requests,
        "rtfx": 0.0,
    }
    values = {"ttft": [r.ttft() for r in done],
              "tpot": [_tpot(r) for r in done if r.output_tokens() > 1],
              "itl": [gap for r in done for gap in np.diff(r.token_times).tolist()],
              "e2el": [r.end_time - r.arrival for r in done]}
    for name in PERCENTILE_METRICS:
        if name in percentile_metrics:
            _stats(result, name, values[name], metric_percentiles)
    if not detailed:
        for field in DETAILED:
            del result[field]
    return result


def result_path(result_dir: str | None, result_filename: str | None, backend: str,
                request_rate: float, model: str, max_concurrency: int | None,
                date: str) -> Path:
    """vLLM's file name unless given: `{backend}-{rate}qps[-concurrency{n}]-{model}-{date}.json`
    in `result_dir` (default: here)."""
    if result_filename is None:
        rate = request_rate if math.isfinite(request_rate) else "inf"
        concurrency = f"-concurrency{max_concurrency}" if max_concurrency is not None else ""
        result_filename = f"{backend}-{rate}qps{concurrency}-{model.split('/')[-1]}-{date}.json"
    return Path(result_dir or ".") / result_filename


def write_vllm_result(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.encode(result))
