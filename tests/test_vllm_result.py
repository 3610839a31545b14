"""`ascendra bench`'s vLLM-compatible results: `--goodput KEY:MS`, `--percentile-metrics`,
`--metric-percentiles` and `--save-result`, whose JSON has `vllm bench serve`'s field
names and meanings (vLLM 0.33.0's vllm/benchmarks/serve.py).

Covers: bench/records/vllm_result.py, bench/records/br_report.py, bench/loadgen/bench_cli.py.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from bench.loadgen.bench_cli import build_parser
from bench.records.schema import RequestRecord
from bench.records.results import read_result, summarize
from bench.records.vllm_result import (
    parse_goodput, parse_metric_percentiles, parse_percentile_metrics, result_path, vllm_result,
)
from tests.test_loadgen import FakeServer, _serve


def _done(index: int, arrival: float, ttft: float, gaps: list[float]) -> RequestRecord:
    times = list(arrival + ttft + np.cumsum([0.0, *gaps]))
    return RequestRecord(index=index, arrival=arrival, prompt_len=10 + index, output_len=len(times),
                         outcome="completed", first_token_time=times[0], token_times=times,
                         end_time=times[-1])


RECORDS = [_done(0, 0.0, 0.1, [0.02, 0.02, 0.02]),       # TPOT 20 ms, e2el 160 ms
           _done(1, 0.5, 0.4, [0.05, 0.05]),             # TPOT 50 ms, e2el 500 ms
           _done(2, 1.0, 0.2, []),                       # one token: no TPOT (0 for goodput)
           RequestRecord(index=3, arrival=1.5, prompt_len=7, output_len=4, outcome="dropped",
                         end_time=1.6, error="dropped: ttft")]


def _result(**changes) -> dict:
    args = dict(backend="openai", model="org/tiny", num_prompts=4, request_rate=2.0,
                burstiness=1.0, max_concurrency=None, goodput={},
                percentile_metrics=["ttft", "tpot", "itl", "e2el"], metric_percentiles=[50, 99],
                detailed=True)
    return vllm_result(RECORDS, 2.0, **{**args, **changes})


def test_the_counts_throughputs_and_per_request_lists_are_vllms():
    r = _result()
    assert (r["completed"], r["failed"], r["num_prompts"]) == (3, 1, 4)
    assert r["total_input_tokens"] == 10 + 11 + 12 and r["total_output_tokens"] == 4 + 3 + 1
    assert r["request_throughput"] == pytest.approx(1.5)
    assert r["output_throughput"] == pytest.approx(4.0)
    assert r["total_token_throughput"] == pytest.approx((33 + 8) / 2)
    assert r["output_lens"] == [4, 3, 1, 0] and r["input_lens"] == [10, 11, 12, 7]
    assert r["ttfts"] == pytest.approx([0.1, 0.4, 0.2, 0.0])
    assert r["itls"][0] == pytest.approx([0.02] * 3) and r["itls"][3] == []
    assert r["latencies"] == pytest.approx([0.16, 0.5, 0.2, 0.0])
    assert r["errors"] == ["", "", "", "dropped: ttft"]
    assert r["request_goodput"] is None          # no --goodput: vLLM writes None
    assert r["request_rate"] == 2.0 and r["backend"] == r["endpoint_type"] == "openai"


def test_percentile_fields_are_named_and_computed_as_vllm_does():
    r = _result()
    assert r["mean_ttft_ms"] == pytest.approx(1000 * np.mean([0.1, 0.4, 0.2]))
    assert r["median_ttft_ms"] == pytest.approx(200.0)
    assert r["p99_ttft_ms"] == pytest.approx(1000 * np.percentile([0.1, 0.4, 0.2], 99))
    assert r["mean_tpot_ms"] == pytest.approx(35.0)      # over requests with > 1 token
    assert r["median_itl_ms"] == pytest.approx(20.0)
    assert r["p50_e2el_ms"] == pytest.approx(200.0)
    assert {"std_ttft_ms", "std_tpot_ms", "std_itl_ms", "std_e2el_ms"} <= set(r)


def test_only_the_metrics_asked_for_are_reported():
    r = _result(percentile_metrics=["ttft"], metric_percentiles=[90.5])
    assert "p90.5_ttft_ms" in r and not any(k.endswith(("_tpot_ms", "_itl_ms", "_e2el_ms"))
                                            for k in r)


@pytest.mark.parametrize("goodput, good", [
    ({"ttft": 300}, 2),                        # the 400 ms one misses
    ({"ttft": 300, "tpot": 10}, 1),            # only the one-token one (TPOT 0) is left
    ({"e2el": 200}, 2),                        # 160 and 200 ms
    ({"ttft": 1000, "tpot": 100, "e2el": 1000}, 3),
])
def test_request_goodput_counts_completed_requests_within_every_target(goodput, good):
    assert _result(goodput=goodput)["request_goodput"] == pytest.approx(good / 2.0)


def test_without_save_detailed_the_per_request_lists_are_left_out_as_vllm_does():
    r = _result(detailed=False)
    assert not {"ttfts", "itls", "input_lens", "output_lens", "errors"} & set(r)
    assert "latencies" in r and "completed" in r


def test_our_summary_takes_the_e2el_target_too():
    result = summarize(RECORDS, {}, 2.0, ttft_slo=1.0, tbt_slo=1.0, e2el_slo=0.2)
    assert result.good == 2 and result.e2el_slo_s == 0.2


@pytest.mark.parametrize("bad", [["ttft=5"], ["latency:5"], ["ttft:-1"], ["ttft:soon"]])
def test_a_malformed_goodput_pair_is_named(bad):
    with pytest.raises(ValueError, match="--goodput"):
        parse_goodput(bad)


def test_flag_values_parse_or_are_refused():
    assert parse_goodput(["ttft:500", "tpot:50", "e2el:2000"]) == {
        "ttft": 500.0, "tpot": 50.0, "e2el": 2000.0}
    assert parse_percentile_metrics("ttft,itl") == ["ttft", "itl"]
    assert parse_metric_percentiles("50,90,99.9") == [50.0, 90.0, 99.9]
    with pytest.raises(ValueError, match="--percentile-metrics"):
        parse_percentile_metrics("ttft,goodput")
    with pytest.raises(ValueError, match="--metric-percentiles"):
        parse_metric_percentiles("0,101")


def test_the_file_is_named_as_vllm_names_it():
    path = result_path(None, None, "openai", 2.0, "org/tiny", None, "20261128-120000")
    assert path.name == "openai-2.0qps-tiny-20261128-120000.json"
    path = result_path("out", None, "openai", float("inf"), "tiny", 8, "20261128-120000")
    assert str(path) == "out/openai-infqps-concurrency8-tiny-20261128-120000.json"
    assert result_path("out", "r.json", "openai", 1.0, "m", None, "d").name == "r.json"


async def test_bench_save_result_writes_vllms_file_and_goodput_sets_our_slos(tmp_path):
    server = FakeServer(max_model_len=16)
    runner, url = await _serve(server)
    trace = tmp_path / "trace.csv"
    trace.write_text("prompt_tokens,output_tokens\n4,3\n6,5\n5,2\n")
    ours = tmp_path / "ours.json"
    args = build_parser().parse_args([
        "--base-url", url, "--dataset-path", str(trace), "--request-rate", "100",
        "--num-prompts", "6", "--goodput", "ttft:5000", "tpot:1000", "e2el:9000",
        "--percentile-metrics", "ttft,tpot,e2el", "--metric-percentiles", "50,99",
        "--save-result", "--result-dir", str(tmp_path / "vllm"), "--result-filename", "r.json",
        "--json", str(ours), "--report", "br0.2", "--disable-tqdm"])
    try:
        from bench.loadgen.bench_cli import run
        assert await asyncio.to_thread(run, args) == 0
    finally:
        await runner.cleanup()
    saved = json.loads((tmp_path / "vllm" / "r.json").read_text())
    assert saved["completed"] == 6 and saved["failed"] == 0 and saved["model_id"] == "fake"
    assert saved["request_goodput"] == pytest.approx(saved["request_throughput"])
    assert {"p50_ttft_ms", "p99_tpot_ms", "median_e2el_ms"} <= set(saved)
    report = json.loads((tmp_path / "vllm" / "benchmark_report_br0.2.json").read_text())
    assert report["results"]["request_performance"]["aggregate"]["requests"]["total"] == 6
    result = read_result(ours)
    assert (result.ttft_slo_s, result.tbt_slo_s, result.e2el_slo_s) == (5.0, 1.0, 9.0)


# ---- llm-d-benchmark's benchmark report (schema 0.2) -------------------------------------------

#: What br_v0_2_json_schema.json requires of the parts written (llm-d-benchmark 8bc9f1dd):
#: a Statistics object has `units` (one of its Units) and `mean`.
SCHEMA_UNITS = {"count", "ms", "s", "ms/token", "s/token", "tokens/s", "queries/s"}


def _check_statistics(stats: dict) -> None:
    assert stats["units"] in SCHEMA_UNITS and isinstance(stats["mean"], float)
    assert set(stats) <= {"units", "mean", "mode", "stddev", "min", "p0p1", "p1", "p5", "p10",
                          "p25", "p50", "p75", "p90", "p95", "p99", "p99p9", "max"}


def test_the_br02_report_has_the_shape_its_schema_requires():
    from datetime import UTC, datetime

    from bench.records.br_report import br02_report
    report = br02_report(RECORDS, 2.0, end=datetime(2026, 11, 28, 12, 0, 2, tzinfo=UTC))
    assert report["version"] == "0.2" and isinstance(report["run"]["uid"], str)
    assert report["run"]["time"] == {"start": "2026-11-28T12:00:00+00:00",
                                     "end": "2026-11-28T12:00:02+00:00", "duration": "PT2.000S"}
    aggregate = report["results"]["request_performance"]["aggregate"]
    assert aggregate["requests"]["total"] == 4 and aggregate["requests"]["failures"] == 1
    latency = aggregate["latency"]
    assert latency["time_to_first_token"]["p50"] == pytest.approx(200.0)
    assert latency["time_per_output_token"]["mean"] == pytest.approx(35.0)
    assert aggregate["throughput"]["request_rate"] == {"units": "queries/s", "mean": 1.5}
    for part in ("latency", "throughput"):
        for stats in aggregate[part].values():
            _check_statistics(stats)
    for name in ("input_length", "output_length"):
        _check_statistics(aggregate["requests"][name])
    assert set(report) == {"version", "run", "results"}


def test_the_br02_report_validates_against_the_schema_file():
    """The report as written, validated against llm-d-benchmark's own schema file (shipped
    in tests/schemas/ with its source and licence)."""
    from datetime import UTC, datetime

    import jsonschema

    from bench.records.br_report import br02_report
    schema = json.loads((Path(__file__).parent / "schemas" / "br_v0_2_json_schema.json").read_text())
    report = br02_report(RECORDS, 2.0, end=datetime(2026, 11, 28, 12, 0, 2, tzinfo=UTC))
    jsonschema.validate(json.loads(json.dumps(report)), schema)
    broken = json.loads(json.dumps(report))
    del broken["run"]["uid"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)
