"""Replaying a real trace's arrival times: the columns public traces use (BurstGPT,
Azure, Mooncake) or a named one, a rate scale or a target rate, and a clear error for
what cannot be honoured -- never arrivals made up in its place.

Covers: bench/loadgen/trace_file.py, bench/loadgen/workloads.py.
"""
from __future__ import annotations

import json

import msgspec
import pytest

from daemon.cli import main as ascendra
from bench.loadgen.trace_file import load_rows
from bench.loadgen.workloads import build_requests, workload
from bench.records.schema import RunResult

TIMES = [0.0, 0.5, 1.0, 3.0, 4.0]            # mean gap 1 s


def write(path, header: str, lines: list[str]) -> str:
    path.write_text(header + "\n" + "".join(line + "\n" for line in lines))
    return str(path)


def replay(trace: str, **kwargs) -> list[float]:
    fields = {k: kwargs.pop(k) for k in ("arrival_column", "arrival_unit", "rate_scale")
              if k in kwargs}
    return [r.arrival for r in build_requests(workload("replay", trace=trace, **fields),
                                              num_requests=kwargs.pop("num_requests", 5),
                                              **kwargs)]


def test_burstgpt_azure_and_mooncake_files_replay_as_they_are(tmp_path):
    burstgpt = write(tmp_path / "burstgpt.csv", "Timestamp,Model,Request tokens,Response tokens,"
                     "Total tokens,Log Type",
                     [f"{100 + t},ChatGPT,{50 + i},{5 + i},0,Conversation log"
                      for i, t in enumerate(TIMES)])
    azure = write(tmp_path / "azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens",
                  [f"2023-11-16 18:15:{46 + t:07.4f}00,{50 + i},{5 + i}"
                   for i, t in enumerate(TIMES)])
    mooncake = tmp_path / "mooncake.jsonl"
    mooncake.write_text("".join(json.dumps({"timestamp": int(t * 1000), "input_length": 50 + i,
                                            "output_length": 5 + i, "hash_ids": [i]}) + "\n"
                                for i, t in enumerate(TIMES)))
    for trace in (burstgpt, azure, str(mooncake)):
        requests = build_requests(workload("replay", trace=trace), num_requests=5)
        assert [r.arrival for r in requests] == pytest.approx(TIMES), trace
        assert [(r.prompt_len, r.output_len) for r in requests] == [(50 + i, 5 + i)
                                                                    for i in range(5)]


def test_a_named_column_and_unit(tmp_path):
    trace = write(tmp_path / "t.csv", "prompt_tokens,output_tokens,sent_ms,arrival_time",
                  [f"10,2,{int(t * 1000)},{9 - t}" for t in TIMES])
    assert replay(trace) == pytest.approx([0.0, 1.0, 3.0, 3.5, 4.0])   # arrival_time, sorted
    assert replay(trace, arrival_column="sent_ms", arrival_unit="ms") == pytest.approx(TIMES)
    assert replay(trace, arrival_column="sent_ms") == pytest.approx([t * 1000 for t in TIMES])


def test_a_named_column_that_is_missing_is_an_error_not_generated_arrivals(tmp_path):
    trace = write(tmp_path / "t.csv", "prompt_tokens,output_tokens,time", ["1,2,0.5", "3,4,"])
    with pytest.raises(ValueError, match=r"no column 'when' \(--arrival-column\); it has: "
                                         r"prompt_tokens, output_tokens, time"):
        load_rows(trace, arrival_column="when")
    with pytest.raises(ValueError, match=r"line 3: no time \(--arrival-column\)"):
        load_rows(trace, arrival_column="time")
    with pytest.raises(ValueError, match="line 3: no time, but other rows have one"):
        load_rows(trace)
    with pytest.raises(ValueError, match="'sharegpt' has no arrival times"):
        load_rows("sharegpt", arrival_column="time")
    bad_date = write(tmp_path / "d.csv", "TIMESTAMP,ContextTokens,GeneratedTokens",
                     ["yesterday,1,2"])
    with pytest.raises(ValueError, match="line 2: TIMESTAMP is 'yesterday', neither a number"):
        load_rows(bad_date)
    untimed = write(tmp_path / "u.csv", "prompt_tokens,output_tokens", ["1,2"])
    with pytest.raises(ValueError, match="workload replay: trace .* has no arrival times"):
        replay(untimed, num_requests=1)


def test_rate_scale_and_target_rate(tmp_path):
    trace = write(tmp_path / "t.csv", "prompt_tokens,output_tokens,arrival_time",
                  [f"10,2,{t}" for t in TIMES])
    assert replay(trace, rate_scale=2.0) == pytest.approx([t / 2 for t in TIMES])
    assert replay(trace, rate_scale=0.5) == pytest.approx([t * 2 for t in TIMES])
    assert replay(trace, rate=4.0) == pytest.approx([t / 4 for t in TIMES])  # mean gap 1 -> 0.25
    assert replay(trace, rate=2.0, num_requests=3) == pytest.approx([0.0, 0.5, 1.0])  # those rows
    assert replay(trace, rate_scale=2.0, num_requests=None, duration=1.0) == [0.0, 0.25, 0.5]
    with pytest.raises(ValueError, match="--qps .* or --rate-scale, not both"):
        replay(trace, rate=2.0, rate_scale=2.0)
    with pytest.raises(ValueError, match="--qps inf on a replayed trace"):
        replay(trace, rate=float("inf"))
    with pytest.raises(ValueError, match="6 were asked for"):
        replay(trace, num_requests=6)
    with pytest.raises(ValueError, match="rate_scale must be > 0"):
        replay(trace, rate_scale=0.0)


def test_each_seed_replays_its_own_stretch_of_the_trace(tmp_path):
    trace = write(tmp_path / "t.csv", "prompt_tokens,output_tokens,arrival_time",
                  [f"{10 + i},2,{t}" for i, t in enumerate(TIMES)])

    def prompts(seed: int, **kwargs) -> list[int]:
        return [r.prompt_len for r in build_requests(workload("replay", trace=trace),
                                                     seed=seed, **kwargs)]

    assert prompts(0, num_requests=2) == [10, 11]
    assert prompts(1, num_requests=2) == [12, 13]
    assert prompts(2, num_requests=2) == [10, 11]         # wrapped: rows 4.. cannot hold two
    assert prompts(3, num_requests=2) == [12, 13]
    assert prompts(1, num_requests=5) == prompts(0, num_requests=5)     # the whole trace
    assert prompts(1, num_requests=None, duration=10.0) == [10, 11, 12, 13, 14]
    arrivals = [r.arrival for r in build_requests(workload("replay", trace=trace), seed=1,
                                                  num_requests=2)]
    assert arrivals == [0.0, 2.0]                          # the stretch's own gaps, from 0


@pytest.mark.slow
def test_the_packaged_azure_conversation_trace_replays_by_default(tmp_path):
    rows = load_rows("azure-conv")
    assert len(rows) == 19_366 and rows[0].arrival == 0.0
    assert all(a.arrival <= b.arrival for a, b in zip(rows, rows[1:]))
    assert rows[-1].arrival == pytest.approx(3501.72, abs=0.01)       # an hour of traffic
    out = tmp_path / "r.json"
    assert ascendra(["simulate", "--layout", "1xsarathi", "--trace", "azure-conv",
                     "--num-requests", "30", "--qps", "3", "--json", str(out)]) == 0
    result = msgspec.json.decode(out.read_bytes(), type=RunResult)
    assert result.config["config"]["workload"]["name"] == "replay" and result.completed == 30


def test_a_generated_workload_takes_only_the_lengths_of_a_timed_trace(tmp_path):
    trace = write(tmp_path / "t.csv", "prompt_tokens,output_tokens,arrival_time",
                  [f"{10 + i},2,{t}" for i, t in enumerate(TIMES)])
    requests = build_requests(workload("poisson", trace=trace), rate=100.0, num_requests=5)
    assert sorted(r.prompt_len for r in requests) == [10, 11, 12, 13, 14]
    assert requests[-1].arrival < 1.0                                  # drawn at 100/s


@pytest.mark.slow
def test_simulate_replays_rescales_and_refuses_on_the_command_line(tmp_path, capsys):
    trace = write(tmp_path / "t.csv", "Timestamp,Request tokens,Response tokens",
                  [f"{t},{20 + i},4" for i, t in enumerate(TIMES)])
    out = tmp_path / "r.json"

    def simulate(*argv: str) -> int:
        return ascendra(["simulate", "--layout", "1xsarathi", "--trace", trace,
                         "--json", str(out), *argv])

    assert simulate() == 0                       # replayed as it stands: every row
    result = msgspec.json.decode(out.read_bytes(), type=RunResult)
    assert result.completed == 5 and result.config["config"]["workload"]["name"] == "replay"
    assert simulate("--rate-scale", "4") == 0
    assert msgspec.json.decode(out.read_bytes(), type=RunResult).duration_s < 2.0
    assert simulate("--workload", "poisson", "--qps", "50", "--num-requests", "8") == 0
    assert msgspec.json.decode(out.read_bytes(), type=RunResult).completed == 8
    capsys.readouterr()
    assert simulate("--workload", "poisson") == 2
    assert "workload 'poisson' needs an arrival rate (--qps)" in capsys.readouterr().err
    assert simulate("--arrival-column", "nope") == 2
    assert "no column 'nope' (--arrival-column)" in capsys.readouterr().err
    assert simulate("--qps", "2", "--rate-scale", "2") == 2
    assert "not both" in capsys.readouterr().err
