"""bench/records/results.py: goodput, percentiles and rates from hand-made records.

Covers: bench/records/results.py.
"""
from __future__ import annotations

import io

import msgspec
import numpy as np
import pytest

from bench.records.results import (RequestRecord, is_good, percentiles, print_summary,
                           read_result, summarize, write_result)
from bench.records.summary_table import plain_summary, summary_rows

TTFT_SLO, TBT_SLO = 1.0, 0.1


def completed(index: int, arrival: float, ttft: float, gaps: list[float], **kw) -> RequestRecord:
    times = list(arrival + ttft + np.concatenate(([0.0], np.cumsum(gaps))))
    return RequestRecord(index=index, arrival=arrival, prompt_len=10, output_len=len(times),
                         outcome="completed", first_token_time=times[0], token_times=times,
                         end_time=times[-1], finish_reason="length", **kw)


def failed(index: int, outcome: str, **kw) -> RequestRecord:
    return RequestRecord(index=index, arrival=float(index), prompt_len=10, output_len=5,
                         outcome=outcome, **kw)


def run_records() -> list[RequestRecord]:
    return [
        completed(0, 0.0, 0.5, [0.05, 0.05, 0.05]),          # good
        completed(1, 1.0, 0.9, [0.02, 0.30]),                # mean TBT 0.16 > 0.1: miss
        completed(2, 2.0, 1.5, [0.01]),                      # TTFT miss
        completed(3, 3.0, 0.2, []),                          # one token: no TBT, good
        completed(4, 4.0, 0.3, [0.08, 0.10], offloaded=True, instance=2, sched_delay=0.25),  # good
        failed(5, "dropped", error_code="ttft_slo_missed"),
        failed(6, "errored"),
        failed(7, "lost"),
    ]


def test_goodput_counts_every_request_and_misses_dropped_lost_errored():
    result = summarize(run_records(), {"tool": "test"}, duration_s=10.0,
                       ttft_slo=TTFT_SLO, tbt_slo=TBT_SLO)
    assert (result.completed, result.dropped, result.errored, result.lost) == (5, 1, 1, 1)
    assert result.good == 3 and result.num_requests == 8
    assert result.goodput_pct == pytest.approx(100 * 3 / 8)
    assert result.goodput_rps == pytest.approx(0.3)
    assert result.throughput_rps == pytest.approx(0.5)
    assert result.offloaded == 1


def test_output_tokens_use_the_usage_count_when_given():
    one_chunk = completed(0, 0.0, 0.1, [0.4])               # two chunks ...
    one_chunk.num_output_tokens = 5                          # ... for five tokens
    assert one_chunk.mean_tbt() == pytest.approx(0.1)       # (0.5 - 0.1) / 4
    result = summarize([one_chunk, failed(1, "lost")], {}, 2.0, TTFT_SLO, TBT_SLO)
    assert result.output_tok_s == pytest.approx(2.5)
    assert result.good == 1 and result.mean_tbt_s.mean == pytest.approx(0.1)
    assert result.tbt_s.p50 == pytest.approx(0.4)           # per-chunk gap


def test_percentiles_over_completed_requests():
    result = summarize(run_records(), {}, 10.0, TTFT_SLO, TBT_SLO)
    ttfts = [0.5, 0.9, 1.5, 0.2, 0.3]
    assert result.ttft_s.mean == pytest.approx(np.mean(ttfts))
    assert result.ttft_s.p50 == pytest.approx(0.5)
    assert result.ttft_s.p99 == pytest.approx(np.percentile(ttfts, 99))
    gaps = [0.05, 0.05, 0.05, 0.02, 0.30, 0.01, 0.08, 0.10]
    assert result.tbt_s.mean == pytest.approx(np.mean(gaps))
    assert result.p99_tbt_s == pytest.approx(np.percentile(gaps, 99)) == result.tbt_s.p99
    means = [0.05, 0.16, 0.01, 0.09]                          # the one-token request has none
    assert result.mean_tbt_s.p90 == pytest.approx(np.percentile(means, 90))
    assert result.sched_delay_s.mean == pytest.approx(0.25)


def test_slo_boundaries_are_inclusive_and_per_request_targets_win():
    edge = completed(0, 0.0, 1.0, [0.1, 0.1])
    assert is_good(edge, 1.0, 0.1)
    assert not is_good(edge, 0.99, 0.1)
    strict = completed(1, 0.0, 0.5, [0.05], ttft_slo=0.4)
    assert not is_good(strict, 1.0, 0.1)
    assert not is_good(failed(2, "dropped"), 1.0, 0.1)


def test_empty_run_and_empty_samples():
    result = summarize([], {}, 0.0, TTFT_SLO, TBT_SLO)
    assert result.goodput_pct == 0.0 and result.throughput_rps == 0.0
    assert result.ttft_s.mean is None and result.p99_tbt_s is None
    assert percentiles([]).p99 is None
    assert percentiles([2.0]).p50 == 2.0


def test_json_round_trip_has_the_schema_fields(tmp_path):
    result = summarize(run_records(), {"qps": 2.0}, 10.0, TTFT_SLO, TBT_SLO,
                       per_instance=[{"id": 0, "role": "lp", "perf_model_mape": 4.2}],
                       perf_model_mape=4.2)
    path = tmp_path / "r.json"
    write_result(result, path)
    data = msgspec.json.decode(path.read_bytes())
    for field in ("config", "num_requests", "duration_s", "goodput_pct", "goodput_rps",
                  "throughput_rps", "output_tok_s", "ttft_s", "tbt_s", "mean_tbt_s",
                  "sched_delay_s", "p99_tbt_s", "completed", "dropped", "errored", "lost",
                  "offloaded", "perf_model_mape", "per_instance"):
        assert field in data, field
    assert set(data["ttft_s"]) == {"mean", "p50", "p90", "p99"}
    assert "records" not in data
    assert read_result(path) == result
    detailed = summarize(run_records(), {}, 10.0, TTFT_SLO, TBT_SLO, keep_records=True)
    write_result(detailed, path)  # numpy floats in records encode too
    assert read_result(path).records[5].outcome == "dropped"


def test_summary_tables_render():
    result = summarize(run_records(), {}, 10.0, TTFT_SLO, TBT_SLO,
                       per_instance=[{"id": 0, "role": "lp", "state": "ready"}])
    text = plain_summary(result)
    assert "37.5 %" in text and "5 / 1 / 1 / 1" in text and "instance 0 (lp)" in text
    out = io.StringIO()
    print_summary(result, file=out)
    assert "goodput" in out.getvalue() and "TTFT" in out.getvalue()


def test_the_rates_over_the_arrival_window_leave_the_drain_apart():
    """Issue #62: `goodput ... 5.77 req/s` at --qps 8 counted the drain in the rate. Arrivals
    at 0..4 s (5 requests: 1 req/s offered); three completed by the last arrival, and the
    last answer 1.5 s after it (request 2: 2.0 + 1.5 + 0.01)."""
    result = summarize(run_records()[:5], {"tool": "test"}, duration_s=5.51,
                       ttft_slo=TTFT_SLO, tbt_slo=TBT_SLO)
    assert result.arrival_window_s == 4.0 and result.offered_rps == 1.0
    # requests 0, 1 and 3 end by t=4 (0.65, 2.22, 3.2); 2 at 3.51 too; 4 at 4.48 does not
    assert result.achieved_rps == pytest.approx(4 / 4.0)
    assert result.drain_s == pytest.approx(4.48 - 4.0)
    rows = dict(summary_rows(result))
    assert rows["offered rate"].startswith("1.00 req/s over 4.0 s")
    assert rows["drain"] == "0.5 s after the last arrival"
    assert "drain included" in rows["over the whole run"]
