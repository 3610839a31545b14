"""bench/loadgen/workload.py: traces from files, sampling, replayed arrivals, clamping, prompts.

Covers: bench/loadgen/workload.py.
"""
from __future__ import annotations

import json

import pytest

from bench.loadgen.workload import (HIGH_TOKEN_ID, LOW_TOKEN_ID, TraceRow, build_workload, clamp,
                            load_rows, prompt_token_ids)


def test_csv_with_either_column_names(tmp_path):
    a = tmp_path / "a.csv"
    a.write_text("num_prefill_tokens,num_decode_tokens,num_total_tokens\n10,5,15\n20,7,27\n")
    b = tmp_path / "b.csv"
    b.write_text("prompt_tokens,output_tokens\n3,4\n")
    assert load_rows(str(a)) == [TraceRow(10, 5), TraceRow(20, 7)]
    assert load_rows(str(b)) == [TraceRow(3, 4)]


def test_jsonl_with_arrival_times_is_replayed_in_time_order(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [{"prompt_tokens": 5, "output_tokens": 2, "arrival_time": 12.5},
            {"prompt_tokens": 6, "output_tokens": 3, "arrival_time": 10.0},
            {"prompt_tokens": 7, "output_tokens": 4, "arrival_time": 11.0}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    work = build_workload(str(path), rate=100.0, num_requests=3)
    assert [(w.arrival, w.prompt_len) for w in work] == [(0.0, 6), (1.0, 7), (2.5, 5)]
    assert len(build_workload(str(path), duration=2.0)) == 2
    with pytest.raises(ValueError):
        build_workload(str(path), num_requests=4)


def test_missing_columns_and_files_are_clear_errors(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("tokens_in,tokens_out\n1,2\n")
    with pytest.raises(ValueError, match="num_prefill_tokens"):
        load_rows(str(path))
    with pytest.raises(FileNotFoundError):
        load_rows(str(tmp_path / "nope.csv"))


def test_sampling_is_seeded_and_uses_the_trace_lengths():
    rows = [TraceRow(p, p + 1) for p in range(1, 101)]
    a = build_workload(rows, rate=10.0, num_requests=50, seed=3)
    assert a == build_workload(rows, rate=10.0, num_requests=50, seed=3)
    assert a != build_workload(rows, rate=10.0, num_requests=50, seed=4)
    assert len({w.prompt_len for w in a}) == 50              # without replacement
    assert all(w.output_len == w.prompt_len + 1 for w in a)
    assert [w.index for w in a] == list(range(50)) and a[0].arrival == 0.0
    assert len(build_workload(rows, rate=10.0, num_requests=300)) == 300


def test_duration_and_scale():
    rows = [TraceRow(800, 80)]
    work = build_workload(rows, rate=50.0, duration=2.0, seed=1, length_scale=8)
    assert 60 < len(work) < 140 and all(w.arrival < 2.0 for w in work)
    assert (work[0].prompt_len, work[0].output_len) == (100, 10)
    with pytest.raises(ValueError):
        build_workload(rows, rate=1.0)


@pytest.mark.parametrize("lengths, limit, expected", [
    ((100, 50), 200, (100, 50)), ((180, 50), 200, (150, 50)), ((10, 500), 200, (1, 199)),
    ((0, 0), None, (1, 1))])
def test_clamp_fits_the_context(lengths, limit, expected):
    assert clamp(*lengths, limit) == expected


def test_built_in_trace_clamped_to_a_small_context():
    work = build_workload("sharegpt", rate=5.0, num_requests=200, seed=0, max_model_len=1024)
    assert all(w.prompt_len + w.output_len <= 1024 and w.prompt_len >= 1 for w in work)


def test_prompts_are_seeded_ids_in_range():
    ids = prompt_token_ids(0, 5, 1000)
    assert len(ids) == 1000 and min(ids) >= LOW_TOKEN_ID and max(ids) < HIGH_TOKEN_ID
    assert ids == prompt_token_ids(0, 5, 1000) and ids != prompt_token_ids(0, 6, 1000)
