"""Mooncake / aiperf `mooncake_trace` JSON lines (`timestamp` ms, `input_length`,
`output_length`, `hash_ids` of 512-token blocks): equal block ids become equal prompt
tokens, so a replay reproduces the trace's prefix reuse -- in the simulator, and on a
live daemon's prefix cache; inference-perf's trace-replay CSV reads as a timed trace.

Covers: bench/loadgen/trace_file.py, bench/loadgen/workloads.py.
"""
from __future__ import annotations

import json

import pytest

from bench.loadgen.trace_file import load_rows
from bench.loadgen.workload import request_prompt
from bench.loadgen.workloads import build_requests, hash_parts, workload
from bench.sim.box_run import simulate
from bench.sim.simulator import SimConfig
from engines.scheduler_config import SchedulerConfig

#: Three requests: the second shares the first's first two blocks, the third shares none.
ROWS = [{"timestamp": 0, "input_length": 1200, "output_length": 4, "hash_ids": [0, 1, 2]},
        {"timestamp": 250, "input_length": 1100, "output_length": 3, "hash_ids": [0, 1, 3]},
        {"timestamp": 1000, "input_length": 300, "output_length": 2, "hash_ids": [4]}]


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_a_mooncake_row_reads_with_its_times_in_ms_and_its_block_ids(tmp_path):
    rows = load_rows(_write(tmp_path / "m.jsonl", ROWS))
    assert [(r.prompt_len, r.output_len, r.arrival) for r in rows] == [
        (1200, 4, 0.0), (1100, 3, 0.25), (300, 2, 1.0)]
    assert [r.hash_ids for r in rows] == [(0, 1, 2), (0, 1, 3), (4,)]


def test_malformed_block_ids_are_named_with_their_line(tmp_path):
    bad = [dict(ROWS[0]), {**ROWS[1], "hash_ids": "0,1"}]
    with pytest.raises(ValueError, match=r"line 2: hash_ids"):
        load_rows(_write(tmp_path / "m.jsonl", bad))


def test_equal_block_ids_are_equal_tokens_and_others_differ(tmp_path):
    spec = workload("replay", trace=_write(tmp_path / "m.jsonl", ROWS))
    a, b, c = (request_prompt(r, seed=0) for r in build_requests(spec, num_requests=3))
    assert [len(a), len(b), len(c)] == [1200, 1100, 300]
    assert a[:1024] == b[:1024] and a[1024:1100] != b[1024:1100]
    assert c[:300] != a[:300]


def test_the_blocks_follow_the_length_scale_and_fill_a_prompt_they_fall_short_of():
    from bench.loadgen.trace_file import TraceRow
    parts = hash_parts(TraceRow(1200, 4, hash_ids=(7, 8, 9)), 0, 300, length_scale=4.0)
    assert [p.length for p in parts] == [128, 128, 44]
    short = hash_parts(TraceRow(2000, 4, hash_ids=(7,)), 5, 600)
    assert [(p.key[1], p.length) for p in short] == [(7, 512), (5, 88)]
    assert hash_parts(TraceRow(10, 1), 0, 10) == ()


@pytest.mark.slow
def test_a_replay_reproduces_the_traces_prefix_reuse_in_the_simulator(tmp_path):
    """Sixty requests on four shared 3-block prefixes: with block ids the simulated
    prefix cache finds most of each prompt after the first of its group; the same
    lengths without ids find nothing."""
    rows = [{"timestamp": 200 * i, "input_length": 1800, "output_length": 8,
             "hash_ids": [10 * (i % 4), 10 * (i % 4) + 1, 10 * (i % 4) + 2, 1000 + i]}
            for i in range(60)]
    shared = _write(tmp_path / "shared.jsonl", rows)
    plain = _write(tmp_path / "plain.jsonl", [{k: v for k, v in r.items() if k != "hash_ids"}
                                              for r in rows])
    config = SimConfig(layout_modes=("sarathi",), scheduler=SchedulerConfig(prefix_caching=True))
    cached = {name: simulate(config, build_requests(workload("replay", trace=trace),
                                                    num_requests=60)).prompt_cached_pct
              for name, trace in (("shared", shared), ("plain", plain))}
    # 56 of 60 requests find 3 x 512 of 1800 tokens (less what a block boundary leaves)
    assert cached["shared"] > 60 and cached["plain"] == 0


def test_inference_perfs_trace_replay_csv_reads_as_a_timed_trace(tmp_path):
    """inference-perf's trace_replay reads the Azure public dataset's CSV: TIMESTAMP,
    ContextTokens, GeneratedTokens."""
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.680000,374,44\n2023-11-16 18:15:47.180000,396,109\n")
    rows = load_rows(str(path))
    assert [(r.prompt_len, r.output_len) for r in rows] == [(374, 44), (396, 109)]
    assert rows[1].arrival - rows[0].arrival == pytest.approx(0.5)


def test_the_interop_studys_trace_is_well_formed_mooncake_with_shared_prefixes():
    """Each row has one block id per 512 tokens (the last partial), as aiperf and guidellm
    rebuild prompts from them; rows of a group share their first two blocks."""
    import math

    from bench.studies.interop_check import mooncake_trace
    rows = mooncake_trace(60, rate=2.0)
    times = [r["timestamp"] for r in rows]
    assert times[0] == 0 and times == sorted(times)
    assert all(len(r["hash_ids"]) == math.ceil(r["input_length"] / 512) for r in rows)
    prefixes = {tuple(r["hash_ids"][:2]) for r in rows}
    assert len(prefixes) == 6
    own = [i for r in rows for i in r["hash_ids"][2:]]
    assert len(own) == len(set(own))      # the rest of each prompt is its own
