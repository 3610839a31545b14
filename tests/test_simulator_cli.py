"""`ascendra simulate` and `ascendra capacity` as a user runs them: the result schema
(the one `ascendra bench` writes too), trace files with lengths and arrival times and
clear errors for bad ones, the capacity search, and goodput accounting (mean TBT).

Covers: bench/sim/simulate_cmd.py, bench/records/results.py.
"""
from __future__ import annotations

import asyncio
import json
import math

import msgspec
import pytest

from daemon.cli import main as ascendra
from bench.loadgen.bench_cli import build_parser as bench_parser
from bench.loadgen.bench_cli import run as run_bench
from bench.records.schema import RequestRecord, RunResult
from bench.records.results import is_good, summarize
from bench.ruler.capacity import find_capacity
from tests.simulator_helpers import length_trace, run, write_jsonl
from tests.test_loadgen import FakeServer, _serve

#: What issue #5 says a run's JSON holds.
FIELDS = ("config", "num_requests", "duration_s", "goodput_pct", "goodput_rps",
          "throughput_rps", "output_tok_s", "ttft_s", "tbt_s", "mean_tbt_s", "sched_delay_s",
          "completed", "dropped", "errored", "lost", "offloaded", "perf_model_mape",
          "per_instance")
PERCENTILE_FIELDS = ("ttft_s", "tbt_s", "mean_tbt_s", "sched_delay_s")


@pytest.fixture(scope="module")
def trace() -> str:
    return length_trace()


@pytest.fixture(scope="module")
def simulated_json(tmp_path_factory, trace) -> bytes:
    """`ascendra simulate --json` on a small 2L1H run."""
    out = tmp_path_factory.mktemp("sim") / "result.json"
    code = ascendra(["simulate", "--layout", "2L1H", "--trace", trace, "--qps", "10",
                     "--num-requests", "60", "--json", str(out)])
    assert code == 0
    return out.read_bytes()


# ---- the schema ----------------------------------------------------------------------------
@pytest.mark.slow
def test_simulate_json_has_every_field_and_decodes_strictly(simulated_json):
    raw = json.loads(simulated_json)
    missing = [f for f in FIELDS if f not in raw]
    assert not missing, f"the result JSON lacks {missing}"
    for name in PERCENTILE_FIELDS:
        assert set(raw[name]) == {"mean", "p50", "p90", "p99"}, name
        assert all(isinstance(v, float) for v in raw[name].values()), name
    assert set(raw) <= set(RunResult.__struct_fields__), "no field outside the schema"
    result = msgspec.json.decode(simulated_json, type=RunResult, strict=True)
    assert result.num_requests == 60
    assert result.completed + result.dropped + result.errored + result.lost == 60
    assert result.config["layout"] == "2L1H" and result.config["qps"] == 10.0
    assert [i["role"] for i in result.per_instance] == ["lp", "lp", "hp"]
    assert sum(i["served"] for i in result.per_instance) == result.completed
    assert result.perf_model_mape is not None and result.perf_model_mape >= 0
    assert 0.0 <= result.goodput_pct <= 100.0 and result.throughput_rps > 0
    assert result.ttft_s.p50 <= result.ttft_s.p90 <= result.ttft_s.p99


async def test_load_generator_writes_the_same_schema(tmp_path, simulated_json):
    """`ascendra bench` against a fake server: the same fields, the same type."""
    server = FakeServer()
    runner, url = await _serve(server)
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("prompt_tokens,output_tokens\n5,3\n6,4\n7,2\n")
    out = tmp_path / "bench.json"
    args = bench_parser().parse_args([
        "--url", url, "--trace", str(lengths), "--qps", "200", "--num-requests", "6",
        "--json", str(out), "--disable-tqdm"])
    try:
        assert await asyncio.to_thread(run_bench, args) == 0
    finally:
        await runner.cleanup()
    bench, simulated = json.loads(out.read_bytes()), json.loads(simulated_json)
    assert set(bench) == set(simulated)
    for name in PERCENTILE_FIELDS:
        assert set(bench[name]) == set(simulated[name])
    result = msgspec.json.decode(out.read_bytes(), type=RunResult, strict=True)
    assert result.completed == 6 and result.config["tool"] == "bench"


# ---- traces --------------------------------------------------------------------------------
LENGTHS = [(120, 7), (45, 30), (800, 3), (16, 64), (300, 12), (9, 9), (1500, 40), (70, 2)]


@pytest.mark.slow
def test_csv_trace_gives_the_lengths_and_generated_arrivals(tmp_path, capsys):
    path = tmp_path / "lengths.csv"
    path.write_text("prompt_tokens,output_tokens\n" + "".join(f"{p},{o}\n" for p, o in LENGTHS))
    slow = run("1xsarathi", str(path), qps=2.0, num_requests=len(LENGTHS))
    fast = run("1xsarathi", str(path), qps=50.0, num_requests=len(LENGTHS))
    for result in (slow, fast):
        assert sorted((r.prompt_len, r.output_len) for r in result.records) == sorted(LENGTHS)
        assert all(r.outcome == "completed" and r.output_tokens() == r.output_len
                   for r in result.records)
    assert slow.records[-1].arrival > fast.records[-1].arrival > 0    # drawn at the rate

    out = tmp_path / "r.json"
    assert ascendra(["simulate", "--layout", "1xsarathi", "--trace", str(path), "--qps", "2",
                     "--num-requests", "20", "--json", str(out)]) == 0
    assert msgspec.json.decode(out.read_bytes(), type=RunResult).completed == 20


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_arrival_times_in_a_trace_replace_generated_arrivals(tmp_path, fmt):
    times = [100.0, 100.25, 101.5, 100.1, 103.0]                # out of order, offset
    rows = [{"num_prefill_tokens": 50 + i, "num_decode_tokens": 4, "arrival_time": t}
            for i, t in enumerate(times)]
    if fmt == "csv":
        path = tmp_path / "timed.csv"
        path.write_text("num_prefill_tokens,num_decode_tokens,arrival_time\n" + "".join(
            f"{r['num_prefill_tokens']},{r['num_decode_tokens']},{r['arrival_time']}\n"
            for r in rows))
        trace = str(path)
    else:
        trace = write_jsonl(tmp_path / "timed.jsonl", rows)
    expected = sorted((t - 100.0, 50 + i) for i, t in enumerate(times))
    for qps in (1.0, 1000.0):                                     # the rate plays no part
        result = run("1xsarathi", trace, qps=qps, num_requests=len(rows))
        assert [r.prompt_len for r in result.records] == [n for _, n in expected]
        assert [r.arrival for r in result.records] == pytest.approx([t for t, _ in expected])

    out = tmp_path / "r.json"  # with no --num-requests, the CLI replays the whole file
    assert ascendra(["simulate", "--layout", "1xsarathi", "--trace", trace, "--qps", "1",
                     "--json", str(out)]) == 0
    replayed = msgspec.json.decode(out.read_bytes(), type=RunResult)
    assert replayed.num_requests == replayed.completed == len(rows)
    assert replayed.duration_s >= 3.0


BAD_TRACES = [  # (file, its text, what the error says)
    ("words.csv", "prompt_tokens,output_tokens\n10,5\n10,abc\n",
     "line 3: output_tokens is 'abc', not a number"),
    ("columns.csv", "tokens_in,tokens_out\n1,2\n",
     ("line 2: needs a column named one of ('num_prefill_tokens', 'prompt_tokens', "
      "'input_length', 'ContextTokens', 'Request tokens') (it has: tokens_in, tokens_out)")),
    ("negative.csv", "prompt_tokens,output_tokens\n-4,5\n",
     "line 2: prompt_tokens is '-4'; it must be a finite number >= 0"),
    ("empty.csv", "prompt_tokens,output_tokens\n", "no rows"),
    ("some-timed.csv", "prompt_tokens,output_tokens,arrival_time\n1,2,0.5\n3,4,\n",
     "line 3: no arrival_time, but other rows have one"),
    ("nan-time.jsonl", '{"prompt_tokens": 1, "output_tokens": 2, "arrival_time": NaN}\n',
     "line 1: arrival_time is nan; it must be a finite number"),
    ("broken.jsonl", '{"prompt_tokens": 1, "output_tokens": 2}\n{"prompt_tokens": 1,\n',
     "line 2: not JSON"),
    ("list.jsonl", "[1, 2]\n", "line 1: expected a JSON object"),
    ("bool.jsonl", '{"prompt_tokens": true, "output_tokens": 2}\n',
     "line 1: prompt_tokens is True, not a number"),
]


@pytest.mark.parametrize("name, text, message", BAD_TRACES, ids=[b[0] for b in BAD_TRACES])
def test_a_bad_trace_file_is_a_clear_error(tmp_path, capsys, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    code = ascendra(["simulate", "--layout", "1xsarathi", "--trace", str(path), "--qps", "1",
                     "--num-requests", "2"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"ascendra simulate: error: trace {path}" in err
    assert message in err


def test_a_missing_trace_or_a_folder_is_a_clear_error(tmp_path, capsys):
    assert ascendra(["simulate", "--trace", str(tmp_path / "nope.csv"), "--qps", "1"]) == 2
    assert "nope.csv': not a file, nor one of ['arxiv', 'azure-conv', 'sharegpt']" in capsys.readouterr().err
    assert ascendra(["simulate", "--trace", str(tmp_path), "--qps", "1"]) == 2
    assert f"trace {tmp_path}: not a file" in capsys.readouterr().err
    path = tmp_path / "binary.csv"
    path.write_bytes(b"\xff\xfe\x00\x81")
    assert ascendra(["simulate", "--trace", str(path), "--qps", "1"]) == 2
    assert "not a UTF-8 text file" in capsys.readouterr().err


# ---- capacity ------------------------------------------------------------------------------
def edge_at(capacity: float):
    """A judge that holds exactly up to `capacity`, and the rates it was asked about."""
    tried = []

    def holds(qps: float) -> bool:
        tried.append(qps)
        return qps <= capacity

    return holds, tried


@pytest.mark.parametrize("start_qps, capacity",
                         [(1.0, 3.55), (10.0, 3.55), (1.0, 0.3), (0.5, 37.0), (9.0, 9.2)])
def test_capacity_search_brackets_the_boundary(start_qps, capacity):
    holds, tried = edge_at(capacity)
    found = find_capacity(holds, start_qps=start_qps, tolerance=0.03)
    assert found <= capacity < found / (1 - 0.03) + 1e-12   # within 3 % below the boundary
    passing = [q for q in tried if q <= capacity]
    failing = [q for q in tried if q > capacity]
    assert max(passing) == found and min(failing) - found <= 0.03 * min(failing)
    assert len(tried) <= 16


def test_capacity_search_stops_after_max_runs():
    holds, tried = edge_at(1e9)  # never fails within reach
    found = find_capacity(holds, start_qps=1.0, max_runs=5, growth=2.0)
    assert tried == [1.0, 2.0, 4.0, 8.0, 16.0] and found == 16.0
    with pytest.raises(ValueError, match="start_qps"):
        find_capacity(holds, start_qps=0.0)


@pytest.mark.slow
def test_capacity_command_on_a_small_simulated_setup(tmp_path, trace, capsys):
    out = tmp_path / "capacity.json"
    assert ascendra(["capacity", "--layout", "1xsarathi", "--trace", trace, "--measured",
                     "40", "--seeds", "0,1", "--ttft-slo", "1", "--tbt-slo", "0.15",
                     "--start-qps", "4", "--tolerance", "0.1", "--workers", "1",
                     "--json", str(out)]) == 0
    captured = capsys.readouterr()
    answer = json.loads(out.read_text())
    # a table for people on stdout (JSON only in --json's file), the configuration readable
    assert captured.out.startswith("capacity of 1xsarathi") and "{" not in captured.out
    assert "hardware ceiling" in captured.out and f"{answer['mean_qps']:.2f}" in captured.out
    assert "measured 40" in captured.err and "layout 1xsarathi" in captured.err
    # 40 measured requests are no steady state: said on stdout and in the JSON
    assert answer["steady_state"] is False and "short run" in answer["warnings"][0]
    assert "WARNING: short run" in captured.out
    assert answer["config"]["measured"] == 40 and answer["config"]["target"] == 90.0
    assert [s["seed"] for s in answer["seeds"]] == [0, 1]
    caps = [s["capacity_qps"] for s in answer["seeds"]]
    assert answer["mean_qps"] == pytest.approx(sum(caps) / 2, abs=1e-3)
    assert answer["min_qps"] == min(caps) and answer["max_qps"] == max(caps)
    assert 0 < answer["mean_qps"] <= answer["ceiling_qps"] * 1.5
    for seed in answer["seeds"]:
        capacity, points = seed["capacity_qps"], seed["points"]
        at = [p for p in points if p["qps"] == capacity]
        assert at and at[0]["holds"] and at[0]["goodput_pct"] >= 90.0
        above = [p["qps"] for p in points if p["qps"] > capacity]
        assert above and not any(p["holds"] for p in points if p["qps"] == min(above))
        assert min(above) - capacity <= 0.1 * min(above) + 1e-9


# ---- goodput accounting --------------------------------------------------------------------
TTFT_SLO, TBT_SLO = 1.0, 0.125  # binary fractions: the boundaries below are exact


def record(index: int, ttft: float | None, gaps: list[float], outcome: str = "completed",
           **fields) -> RequestRecord:
    arrival = float(index)
    times = [] if ttft is None else [arrival + ttft]
    for gap in gaps:
        times.append(times[-1] + gap)
    return RequestRecord(index=index, arrival=arrival, prompt_len=10, output_len=len(times) or 4,
                         outcome=outcome, first_token_time=times[0] if times else None,
                         token_times=times, end_time=times[-1] if times else arrival + 1.0,
                         **fields)


HAND_BUILT = [  # (record, good?)
    (record(0, 0.5, [0.125] * 3), True),                  # mean TBT exactly at the SLO
    (record(1, 0.25, [0.0625, 0.0625, 0.0625, 0.3125]), True),  # one gap 0.31 s, mean 0.125
    (record(2, 1.0, [0.0625]), True),                     # TTFT exactly at the SLO
    (record(3, 1.0625, [0.0625]), False),                 # TTFT over
    (record(4, 0.25, [0.25, 0.0625]), False),             # mean TBT 0.156 over
    (record(5, 0.75, []), True),                          # one token: no TBT to miss
    (record(6, None, [], outcome="dropped", error_code="ttft_slo_missed"), False),
    (record(7, 0.25, [0.0625], outcome="errored"), False),  # tokens, then an error
    (record(8, 0.25, [0.0625], outcome="lost"), False),
    (record(9, 0.25, [0.0625] * 2, ttft_slo=0.125), False),  # its own, tighter TTFT target
]


def test_goodput_counts_requests_within_ttft_and_mean_tbt_over_all_requests():
    records = [r for r, _ in HAND_BUILT]
    result = summarize(records, {}, duration_s=20.0, ttft_slo=TTFT_SLO, tbt_slo=TBT_SLO)
    expected_good = [r.index for r, good in HAND_BUILT if good]
    assert [r.index for r in records if is_good(r, TTFT_SLO, TBT_SLO)] == expected_good
    assert result.good == 4
    assert result.goodput_pct == pytest.approx(40.0)
    assert result.goodput_rps == pytest.approx(4 / 20.0)
    assert (result.completed, result.dropped, result.errored, result.lost) == (7, 1, 1, 1)
    assert result.p99_tbt_s > TBT_SLO > result.mean_tbt_s.p50  # per-gap tail vs per-request mean


@pytest.mark.slow
def test_simulated_goodput_follows_the_definition(trace):
    """Recount a simulated run's goodput from its records by the definition."""
    result = run("3xsarathi", trace, qps=30.0, num_requests=100, ttft_slo=0.5, tbt_slo=0.05)
    good = 0
    for r in result.records:
        if r.outcome != "completed":
            continue
        ttft = r.token_times[0] - r.arrival
        n = len(r.token_times)
        mean_tbt = (r.token_times[-1] - r.token_times[0]) / (n - 1) if n > 1 else 0.0
        good += ttft <= 0.5 and mean_tbt <= 0.05
    assert 0 < good < len(result.records), "a run with both good and missed requests"
    assert result.good == good
    assert result.goodput_pct == pytest.approx(100.0 * good / len(result.records))
    assert result.goodput_rps == pytest.approx(good / result.duration_s)
    assert math.isclose(result.duration_s, max(r.end_time for r in result.records)
                        - min(r.arrival for r in result.records))
