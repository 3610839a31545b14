"""`ascendra records FILE` on a small hand-made records file: goodput by class, prompt
length, instance and offload, and each miss under its cause; and the records files that
`simulate --records` and `bench --records` write, read back by it.

Covers: bench/records/records_report.py, bench/records/records_cmd.py.
"""
from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from daemon.cli import main as ascendra
from bench.loadgen.bench_cli import build_parser as bench_parser
from bench.loadgen.bench_cli import run as run_bench
from bench.loadgen.workloads import SLO_CLASSES
from bench.records.schema import RecordRow, RunResult
from bench.records.records_file import read_records, write_records
from bench.records.records_report import RecordsReport, report
from tests.test_loadgen import FakeServer, _serve

CLASS_SLO = {c.name: (c.ttft_slo, c.tbt_slo) for c in SLO_CLASSES}


def row(index: int, slo_class: str, prompt: int, outcome: str = "completed", *,
        met: bool = False, ttft: float | None = None, queue: float | None = None,
        tbt: float | None = None, instances: tuple[int, ...] = (), offloaded: bool = False,
        code: str | None = None, measured: bool = True) -> RecordRow:
    ttft_slo, tbt_slo = CLASS_SLO[slo_class]
    return RecordRow(index=index, arrival=float(index), prompt_tokens=prompt, output_tokens=8,
                     max_tokens=8, slo_class=slo_class, ttft_slo=ttft_slo, tbt_slo=tbt_slo,
                     outcome=outcome, met_slo=met, instances=list(instances), offloaded=offloaded,
                     queue_delay=queue, ttft=ttft, mean_tbt=tbt, max_tbt=tbt,
                     finish_reason="length" if outcome == "completed" else None,
                     error_code=code, measured=measured)


ROWS = [
    row(0, "interactive", 100, met=True, ttft=0.2, queue=0.05, tbt=0.05, instances=(0,)),
    row(1, "interactive", 600, ttft=1.5, queue=1.2, tbt=0.05, instances=(0,)),     # queued
    row(2, "interactive", 5000, ttft=0.8, queue=0.1, tbt=0.05, instances=(0, 2),   # prefill
        offloaded=True),
    row(3, "standard", 3000, ttft=0.3, queue=0.1, tbt=0.3, instances=(1,)),        # TBT
    row(4, "standard", 2500, "dropped", code="ttft_slo_missed", instances=(1,)),
    row(5, "batch", 10, "errored"),
    row(6, "batch", 10, "lost", instances=(2,)),
    row(7, "standard", 700, met=True, ttft=0.1, tbt=0.05, instances=(1,), measured=False),
    row(8, "batch", 4096, met=True, ttft=3.0, queue=2.5, tbt=0.2, instances=(2,), offloaded=True),
]


def table(groups) -> dict[str, tuple[int, int]]:
    return {g.group: (g.requests, g.good) for g in groups}


def test_goodput_by_group_over_the_measured_rows():
    r = report(ROWS, "r.jsonl")
    assert (r.requests, r.left_out, r.good, r.goodput_pct) == (8, 1, 2, 25.0)
    assert table(r.by_class) == {"batch": (3, 1), "interactive": (3, 1), "standard": (2, 0)}
    assert table(r.by_prompt_len) == {"<512": (3, 1), "512-2047": (1, 0), "2048-4095": (2, 0),
                                      ">=4096": (2, 1)}
    assert [g.group for g in r.by_prompt_len] == ["<512", "512-2047", "2048-4095", ">=4096"]
    assert table(r.by_instance) == {"0": (2, 1), "1": (2, 0), "2": (3, 1), "none": (1, 0)}
    assert [g.group for g in r.by_instance] == ["0", "1", "2", "none"]
    assert table(r.by_offload) == {"not offloaded": (6, 1), "offloaded": (2, 1)}
    standard = r.by_class[2]
    assert (standard.completed, standard.dropped, standard.errored, standard.lost) == (1, 1, 0, 0)
    everything = report(ROWS, measured_only=False)
    assert (everything.requests, everything.good, everything.left_out) == (9, 3, 0)
    assert table(everything.by_class)["standard"] == (3, 1)


def test_every_miss_has_its_cause_and_the_worst_come_with_their_numbers():
    r = report(ROWS)
    assert {m.cause: m.count for m in r.misses} == {
        "ttft_queued": 1, "ttft": 1, "tbt": 1, "dropped:ttft_slo_missed": 1, "errored:none": 1,
        "lost": 1}
    assert sum(m.share_pct for m in r.misses) == pytest.approx(100.0)
    worst = {w.cause: w for w in r.worst}
    assert (worst["ttft_queued"].index, worst["ttft_queued"].queue_delay) == (1, 1.2)
    assert (worst["ttft"].index, worst["ttft"].prompt_tokens, worst["ttft"].instances) == (
        2, 5000, [0, 2])
    assert (worst["tbt"].index, worst["tbt"].mean_tbt, worst["tbt"].tbt_slo) == (3, 0.3, 0.15)
    assert worst["dropped:ttft_slo_missed"].index == 4


def test_starvation_is_the_longest_wait_for_a_first_answer_in_ttft_targets():
    rows = [msgspec.structs.replace(row(0, "interactive", 100, met=True, ttft=0.2, tbt=0.05),
                                    answer_wait=0.2),
            msgspec.structs.replace(row(1, "standard", 9000, "dropped", code="ttft_slo_missed"),
                                    answer_wait=7.0),   # answered (dropped) after 3.5 x 2 s
            row(2, "batch", 10, "lost")]                # never answered: not a wait
    r = report(rows)
    assert r.max_wait_slo_multiple == pytest.approx(3.5)
    assert r.p99_ttft_s == pytest.approx(0.2)


def test_worst_examples_are_the_furthest_over_their_target():
    rows = [row(i, "interactive", 100, ttft=t, queue=0.0, tbt=0.05, instances=(0,))
            for i, t in enumerate([0.6, 2.0, 0.9, 1.2])]
    assert [w.index for w in report(rows, examples=2).worst] == [1, 3]


def test_the_records_command_prints_and_writes_json(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    write_records(path, ROWS)
    out = tmp_path / "report.json"
    assert ascendra(["records", str(path), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    for text in ("goodput 25.0 %", "1 outside the steady-state window left out",
                 "TTFT missed while queued", "dropped (ttft_slo_missed)", "errored (none)",
                 ">=4096", "offloaded", "p99 TTFT of completed requests"):
        assert text in printed, text
    written = msgspec.json.decode(out.read_bytes(), type=RecordsReport)
    assert written == report(ROWS, str(path))
    path.write_text(path.read_text() + '{"index": "x"}\n')
    assert ascendra(["records", str(path)]) == 2
    assert f"records {path} line 10" in capsys.readouterr().err
    assert ascendra(["records", str(tmp_path / "none.jsonl")]) == 2
    assert "not a file" in capsys.readouterr().err


def test_a_file_without_misses_says_so_rather_than_print_an_empty_table(tmp_path, capsys):
    path = tmp_path / "good.jsonl"
    write_records(path, [ROWS[0]])
    assert ascendra(["records", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "misses by cause: none" in printed and "worst examples" not in printed


@pytest.mark.slow
def test_simulate_writes_records_the_report_agrees_with(tmp_path):
    records, out = tmp_path / "sim.jsonl", tmp_path / "sim.json"
    assert ascendra(["simulate", "--layout", "2L1H", "--qps", "12", "--num-requests", "200",
                     "--workload", "mixed-slo", "--records", str(records),
                     "--json", str(out)]) == 0
    result = msgspec.json.decode(out.read_bytes(), type=RunResult)
    assert "records" not in json.loads(out.read_bytes())       # not the whole run in the JSON
    rows = read_records(records)
    assert len(rows) == 200 and sum(r.met_slo for r in rows) == result.good
    assert {r.slo_class for r in rows} == set(CLASS_SLO)
    assert all((r.ttft_slo, r.tbt_slo) == CLASS_SLO[r.slo_class] for r in rows)
    summary = report(rows)
    assert {g.group: g.good for g in summary.by_class} == {
        c.slo_class: c.good for c in result.per_class}
    assert all(r.queue_delay is not None for r in rows if r.outcome == "completed")


async def test_bench_sends_each_request_its_class_slos_and_writes_records(tmp_path, capsys):
    server = FakeServer()
    runner, url = await _serve(server)
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("prompt_tokens,output_tokens\n5,3\n6,4\n7,2\n")
    records, out = tmp_path / "bench.jsonl", tmp_path / "bench.json"
    args = bench_parser().parse_args([
        "--url", url, "--trace", str(lengths), "--qps", "300", "--num-requests", "30",
        "--workload", "mixed-slo", "--slo-mix", "interactive=0.5,batch=0.5",
        "--records", str(records), "--json", str(out), "--disable-tqdm"])
    try:
        assert await asyncio.to_thread(run_bench, args) == 0
    finally:
        await runner.cleanup()
    rows = read_records(records)
    assert len(rows) == 30 and {r.slo_class for r in rows} == {"interactive", "batch"}
    sent = {(b["ttft_slo"], b["tbt_slo"]) for b in server.bodies}
    assert sent == {CLASS_SLO["interactive"], CLASS_SLO["batch"]}
    result = msgspec.json.decode(out.read_bytes(), type=RunResult)
    assert sorted(c.slo_class for c in result.per_class) == ["batch", "interactive"]
    assert sum(c.num_requests for c in result.per_class) == 30
    assert result.config["workload"]["slo_mix"] == [{"slo_class": "interactive", "share": 0.5},
                                                   {"slo_class": "batch", "share": 0.5}]
    assert "goodput by SLO class" in capsys.readouterr().out
