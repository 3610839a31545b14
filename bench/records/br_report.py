"""A run as llm-d-benchmark's benchmark report, schema version 0.2 (`ascendra bench
--report br0.2`), so llm-d-benchmark's analysis reads it beside its own harnesses' runs.

The fields follow `br_v0_2_json_schema.json` of llm-d/llm-d-benchmark
(`llmdbenchmark/analysis/benchmark_report/`, Apache-2.0): `version`, `run` (a `uid`, the
run's start, end and ISO-8601 duration), and `results.request_performance.aggregate` --
`requests` (total, failures, incomplete, input and output lengths), `latency` (TTFT,
TPOT, ITL, request latency) and `throughput` (token and request rates), each a
`Statistics` object (`units`, `mean`, `stddev`, `min`, `max`, percentiles `p1`..`p99p9`).
The schema file is not on the package registry; tests/schemas/ ships a copy (source,
commit and licence named there) that tests/test_vllm_result.py validates the report
against with jsonschema.
Meanings as in bench/records/vllm_result.py: TPOT is (latency - TTFT) / (tokens - 1) per
request, ITL every gap between streamed chunks; failures are dropped or errored
requests, incomplete ones lost.
"""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import numpy as np

from bench.records.schema import RequestRecord

VERSION = "0.2"
#: The schema's percentile fields and the percentile each stands for.
PERCENTILES = {"p0p1": 0.1, "p1": 1, "p5": 5, "p10": 10, "p25": 25, "p50": 50, "p75": 75,
               "p90": 90, "p95": 95, "p99": 99, "p99p9": 99.9}


def statistics(values, units: str) -> dict | None:
    """The schema's `Statistics` of `values` (None for none)."""
    data = np.asarray(list(values), dtype=float)
    if data.size == 0:
        return None
    stats = {"units": units, "mean": float(data.mean()), "stddev": float(data.std()),
             "min": float(data.min()), "max": float(data.max())}
    stats.update({name: float(np.percentile(data, p)) for name, p in PERCENTILES.items()})
    return stats


def _rate(value: float, units: str) -> dict:
    return {"units": units, "mean": value}


def br02_report(records: list[RequestRecord], duration_s: float, *, end: datetime,
                description: str = "", keywords: tuple[str, ...] = ()) -> dict:
    """The report of a run that ended at `end` (aware datetime), its records in order."""
    records = [r for r in records if not r.warmup]
    done = [r for r in records if r.outcome == "completed" and r.first_token_time is not None
            and r.end_time is not None]
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: 0.0)
    tokens_in = sum(r.prompt_len for r in done)
    tokens_out = sum(r.output_tokens() for r in done)
    start = end - timedelta(seconds=duration_s)
    latency = {
        "time_to_first_token": statistics((1000 * r.ttft() for r in done), "ms"),
        "time_per_output_token": statistics(
            (1000 * (r.end_time - r.first_token_time) / (r.output_tokens() - 1)
             for r in done if r.output_tokens() > 1), "ms/token"),
        "inter_token_latency": statistics(
            (1000 * g for r in done for g in np.diff(r.token_times)), "ms/token"),
        "request_latency": statistics((1000 * (r.end_time - r.arrival) for r in done), "ms"),
    }
    return {
        "version": VERSION,
        "run": {"uid": uuid.uuid4().hex,
                "time": {"start": start.isoformat(), "end": end.isoformat(),
                         "duration": f"PT{duration_s:.3f}S"},
                "description": description or None, "keywords": list(keywords) or None},
        "results": {"request_performance": {"aggregate": {
            "requests": {
                "total": len(records),
                "failures": sum(r.outcome in ("dropped", "errored") for r in records),
                "incomplete": sum(r.outcome == "lost" for r in records),
                "input_length": statistics((r.prompt_len for r in done), "count"),
                "output_length": statistics((r.output_tokens() for r in done), "count")},
            "latency": latency,
            "throughput": {
                "input_token_rate": _rate(per_s(tokens_in), "tokens/s"),
                "output_token_rate": _rate(per_s(tokens_out), "tokens/s"),
                "total_token_rate": _rate(per_s(tokens_in + tokens_out), "tokens/s"),
                "request_rate": _rate(per_s(len(done)), "queries/s")},
        }}},
    }


def now() -> datetime:
    return datetime.now(UTC)
