"""Tenants on the bench side (issue #29): `--tenant-mix` (parsing, a seeded draw that leaves
arrivals and lengths alone), the simulator and the load generator passing each request's
tenant and priority on, per-tenant results and reports, and the tenants study.

Covers: bench/loadgen/tenant_mix.py, bench/studies/tenants.py.
"""
from __future__ import annotations

import json

import msgspec
import pytest

from daemon.cli import build_parser, main
from bench.loadgen.loadgen import Client, run_load
from bench.loadgen.progress import Progress
from bench.loadgen.tenant_mix import TenantShare, mix_text, parse_tenant_mix, tenant_rates
from bench.loadgen.workload import WorkloadRequest
from bench.loadgen.workloads import build_requests, workload
from bench.records.schema import RecordRow, RequestRecord, RunResult
from bench.records.records_report import report
from ipc.tenancy import TENANT_HEADER
from bench.records.results import per_tenant, summarize
from bench.records.request_classes import RequestClasses, class_goodput, holds_floor
from bench.ruler.ruler import RulerConfig, Subject, sim_config
from bench.sim.sim_flags import sim_settings
from bench.sim.simulator import SimConfig, Simulation
from bench.studies.tenants import service_per_window
from bench.records.summary_table import plain_summary
from daemon.core.events import Arrived
from tests.test_loadgen import FakeServer, _serve


# ---- --tenant-mix -------------------------------------------------------------------------
def test_a_tenant_mix_is_parsed_with_normalised_shares_and_defaults():
    mix = parse_tenant_mix("heavy=3, light=1:2,batch=4:1:-1")
    assert [t.tenant for t in mix] == ["heavy", "light", "batch"]
    assert [t.share for t in mix] == pytest.approx([0.375, 0.125, 0.5])
    assert [(t.weight, t.priority) for t in mix] == [(1.0, 0), (2.0, 0), (1.0, -1)]
    assert tenant_rates(mix, 8.0) == pytest.approx({"heavy": 3.0, "light": 1.0, "batch": 4.0})
    text = mix_text(mix, 8.0)
    assert "heavy 3.00 req/s (37.5 %" in text and "batch 4.00 req/s" in text
    assert "priority -1 (sheddable)" in text


@pytest.mark.parametrize("text, why", [
    ("", "no tenants"),
    ("heavy", "not NAME=SHARE"),
    ("=0.5", "not NAME=SHARE"),
    ("a=x", "not a number"),
    ("a=1:y", "not a number"),
    ("a=1:1:0.5", "not an integer"),
    ("a=1:1:1:1", "more than SHARE:WEIGHT:PRIORITY"),
    ("a=0,b=1", "share of a must be > 0"),
    ("a=-1", "share of a must be > 0"),
    ("a=inf", "share of a must be > 0"),
    ("a=1:0", "weight of a must be > 0"),
    ("a=1:1:-101", "priority of a must be in [-100, 100]"),
    ("a=1,a=2", "named twice"),
    ("a b=1", "spaces"),
])
def test_a_bad_tenant_mix_is_an_error_naming_the_flag(text, why):
    with pytest.raises(ValueError) as info:
        parse_tenant_mix(text)
    assert str(info.value).startswith(f"--tenant-mix {text!r}: ") and why in str(info.value)


def test_the_commands_refuse_a_bad_mix_naming_the_flag(capsys):
    assert main(["simulate", "--qps", "2", "--num-requests", "5", "--tenant-mix", "a=1:0"]) == 2
    err = capsys.readouterr().err
    assert "ascendra simulate: error: --tenant-mix 'a=1:0': the weight of a must be > 0" in err
    for verb in ("bench", "capacity", "simulate"):  # every command with the workload flags
        args = build_parser().parse_args([verb, "--tenant-mix", "a=1"])
        assert args.tenant_mix == "a=1"


def test_tenants_are_drawn_by_seed_apart_from_arrivals_lengths_and_classes():
    mix = parse_tenant_mix("a=0.7:2,b=0.3:1:-1")
    plain = build_requests(workload("mixed-slo"), rate=10.0, num_requests=3000, seed=4)
    mixed = build_requests(workload("mixed-slo", tenant_mix=mix), rate=10.0, num_requests=3000,
                           seed=4)
    stripped = [msgspec.structs.replace(r, tenant=None, priority=0) for r in mixed]
    assert stripped == plain  # same arrivals, lengths and classes: only who sends them
    again = build_requests(workload("mixed-slo", tenant_mix=mix), rate=10.0, num_requests=3000,
                           seed=4)
    assert [r.tenant for r in again] == [r.tenant for r in mixed]
    other = build_requests(workload("mixed-slo", tenant_mix=mix), rate=10.0, num_requests=3000,
                           seed=5)
    assert [r.tenant for r in other] != [r.tenant for r in mixed]
    share_a = sum(r.tenant == "a" for r in mixed) / len(mixed)
    assert share_a == pytest.approx(0.7, abs=0.03)
    assert {(r.tenant, r.priority) for r in mixed} == {("a", 0), ("b", -1)}
    # a workload with reuse, and one in phases, get tenants too
    for name in ("multi-turn", "shifting"):
        requests = build_requests(workload(name, tenant_mix=mix), rate=5.0, duration=60.0, seed=1)
        assert {r.tenant for r in requests} == {"a", "b"}


def test_a_mix_and_its_rates_are_in_the_configuration_the_simulator_prints(capsys):
    assert main(["simulate", "--layout", "1xsarathi", "--qps", "4", "--num-requests", "30",
                 "--sim-latency", "constant:0.01", "--tenant-mix", "heavy=3,light=1"]) == 0
    out = capsys.readouterr().out
    assert "tenants: heavy 3.00 req/s (75.0 %, weight 1, priority 0); light 1.00 req/s" in out
    assert "per tenant" in out


# ---- the simulator ------------------------------------------------------------------------
def test_the_mix_weights_are_the_tenants_weights_unless_the_run_names_them():
    parser = build_parser()
    args = parser.parse_args(["simulate", "--tenant-mix", "a=1:2,b=1:3,c=1",
                              "--tenant-weights", "b=5", "--no-fair-share"])
    subject, config = sim_settings(args)
    tenants = sim_config(subject, config).tenants
    assert tenants.tenant_weights == {"a": 2.0, "b": 5.0, "c": 1.0}
    assert tenants.fair_share is False
    plain = sim_settings(parser.parse_args(["simulate"]))
    assert sim_config(*plain).tenants.tenant_weights == {}


def test_the_simulator_hands_each_arrival_its_tenant_and_priority():
    work = [WorkloadRequest(0, 0.0, 20, 3, tenant="a", priority=-1),
            WorkloadRequest(1, 0.01, 20, 3)]
    simulation = Simulation(SimConfig(layout_modes=("sarathi",), latency="constant:0.01"), work)
    arrived = []
    handle = simulation.controller.handle

    def spy(event):
        if isinstance(event, Arrived):
            arrived.append(event)
        return handle(event)

    simulation.controller.handle = spy
    records = simulation.run()
    assert [(e.tenant, e.priority) for e in arrived] == [("a", -1), ("default", 0)]
    assert [(r.tenant, r.priority) for r in records] == [("a", -1), (None, 0)]
    assert all(r.outcome == "completed" for r in records)


# ---- the load generator -------------------------------------------------------------------
def test_the_load_generator_names_the_tenant_in_a_header_and_sends_its_priority():
    client = Client(None, "http://x/v1/completions", {"priority": 3, "stream": True}, 0,
                    Progress(1, enabled=False), None)
    mine = WorkloadRequest(0, 0.0, 4, 2, tenant="team-a", priority=-1)
    anyone = WorkloadRequest(1, 0.0, 4, 2)
    assert client.headers(mine) == {"Content-Type": "application/json",
                                    TENANT_HEADER: "team-a"}
    assert client.headers(anyone) == {"Content-Type": "application/json"}
    assert json.loads(client.body(mine))["priority"] == -1      # the tenant's wins
    assert json.loads(client.body(anyone))["priority"] == 3     # the run's --priority


async def test_a_live_run_sends_the_header_and_records_the_tenant():
    class Spy(FakeServer):
        async def completions(self, request):
            self.headers = getattr(self, "headers", []) + [dict(request.headers)]
            return await super().completions(request)

    server = Spy()
    runner, url = await _serve(server)
    try:
        work = [WorkloadRequest(0, 0.0, 5, 3, tenant="heavy"),
                WorkloadRequest(1, 0.01, 5, 3, tenant="light", priority=-2)]
        run = await run_load(url, work, timeout=5.0, progress=False)
    finally:
        await runner.cleanup()
    tenants = sorted(h.get(TENANT_HEADER) for h in server.headers)
    assert tenants == ["heavy", "light"]
    assert sorted(b["priority"] for b in server.bodies) == [-2, 0]
    assert [(r.tenant, r.priority) for r in run.records] == [("heavy", 0), ("light", -2)]
    result = summarize(run.records, {}, run.duration_s, 1.0, 0.1)
    assert [t.tenant for t in result.per_tenant] == ["heavy", "light"]


# ---- results and reports ------------------------------------------------------------------
def record(index: int, tenant: str | None, outcome: str = "completed", *, ttft: float = 0.5,
           prompt: int = 100, output: int = 10, priority: int = 0) -> RequestRecord:
    r = RequestRecord(index=index, arrival=float(index), prompt_len=prompt, output_len=output,
                      outcome=outcome, tenant=tenant, priority=priority)
    if outcome == "completed":
        r.first_token_time = r.arrival + ttft
        r.token_times = [r.first_token_time + 0.05 * k for k in range(output)]
        r.end_time = r.token_times[-1]
    else:
        r.end_time = r.arrival + 2.0
    return r


RECORDS = [
    record(0, "a", ttft=0.2, prompt=100, output=10),      # good
    record(1, "a", ttft=3.0, prompt=300, output=20),      # completed, TTFT missed
    record(2, "a", "dropped", prompt=600, output=40),
    record(3, "b", ttft=0.4, prompt=50, output=5, priority=-1),   # good
    record(4, None, ttft=0.1, prompt=10, output=2),       # no tenant named: "default"
]


def test_per_tenant_results_on_hand_made_records():
    rows = {t.tenant: t for t in per_tenant(RECORDS, 1.0, 0.1)}
    assert list(rows) == ["a", "b", "default"]
    a = rows["a"]
    assert (a.num_requests, a.good, a.dropped, a.priority) == (3, 1, 1, 0)
    assert a.goodput_pct == pytest.approx(100 / 3)
    assert a.served_tokens == 100 + 10 + 300 + 20       # completed only: the drop computed none
    assert a.token_goodput_pct == pytest.approx(100 * 110 / (110 + 320 + 640))
    assert a.p99_ttft_s == pytest.approx(0.2 + 0.99 * 2.8)
    b = rows["b"]
    assert (b.num_requests, b.good, b.goodput_pct, b.served_tokens, b.priority) == (
        1, 1, 100.0, 55, -1)
    assert rows["default"].served_tokens == 12
    assert per_tenant([msgspec.structs.replace(r, tenant=None) for r in RECORDS], 1.0, 0.1) == []
    result = summarize(RECORDS, {}, 10.0, 1.0, 0.1)
    assert result.per_tenant == per_tenant(RECORDS, 1.0, 0.1)
    decoded = msgspec.json.decode(msgspec.json.encode(result), type=RunResult)
    assert decoded.per_tenant == result.per_tenant
    text = plain_summary(result)
    assert "per tenant (priority < 0: sheddable):" in text
    line = next(l for l in text.splitlines() if l.strip().startswith("a "))
    assert "33.3" in line and "430" in line


def test_records_files_and_their_report_group_by_tenant():
    from bench.records.records_file import record_rows
    rows = record_rows(RECORDS, 1.0, 0.1)
    assert [r.tenant for r in rows] == ["a", "a", "a", "b", None]
    result = report(rows)
    assert [(g.group, g.requests, g.good, g.dropped) for g in result.by_tenant] == [
        ("a", 3, 1, 1), ("b", 1, 1, 0), ("default", 1, 1, 0)]
    untenanted = [msgspec.structs.replace(r, tenant=None) for r in rows]
    assert report(untenanted).by_tenant == []
    old = msgspec.json.decode(b'{"index": 0, "arrival": 0.0, "prompt_tokens": 1, '
                              b'"output_tokens": 1, "max_tokens": 1, "slo_class": null, '
                              b'"ttft_slo": 1.0, "tbt_slo": 0.1, "outcome": "completed", '
                              b'"met_slo": true, "instances": [], "offloaded": false, '
                              b'"queue_delay": null, "ttft": 0.1, "mean_tbt": null, '
                              b'"max_tbt": null, "finish_reason": "length", '
                              b'"error_code": null}', type=RecordRow)
    assert old.tenant is None  # a file written before tenants reads as before


def test_the_records_command_prints_the_tenant_table(tmp_path, capsys):
    from bench.records.records_file import record_rows, write_records
    path = tmp_path / "r.jsonl"
    write_records(path, record_rows(RECORDS, 1.0, 0.1))
    assert main(["records", str(path), "--all"]) == 0
    out = capsys.readouterr().out
    assert "goodput by tenant" in out


def test_the_rulers_classes_add_tenants_and_hold_no_floor_for_sheddable_ones():
    classes = RequestClasses.from_prompts([r.prompt_len for r in RECORDS])
    goodput = {c.name: c for c in class_goodput(RECORDS, classes, 1.0, 0.1)}
    assert goodput["tenant a"].requests == 3 and goodput["tenant a"].floored
    assert goodput["tenant b"].goodput_pct == 100.0 and not goodput["tenant b"].floored
    assert goodput["tenant default"].requests == 1
    served = [record(i, "a", ttft=0.2) for i in range(9)]
    shed = served + [record(9, "b", "dropped", priority=-1)]
    assert holds_floor(class_goodput(shed, RequestClasses(()), 1.0, 0.1), 0.8)
    refused = served + [record(9, "b", "dropped")]  # b not sheddable: it must reach the floor
    assert not holds_floor(class_goodput(refused, RequestClasses(()), 1.0, 0.1), 0.8)
    none = [msgspec.structs.replace(r, tenant=None) for r in RECORDS]
    assert not any(c.name.startswith("tenant") for c in class_goodput(none, classes, 1.0, 0.1))
    # a point's JSON is as before where no class is a sheddable tenant's
    assert b"floored" not in msgspec.json.encode(goodput["tenant a"])


def test_the_capacity_configuration_shows_the_mix_as_the_flag_takes_it():
    from bench.sim.simulate_cmd import _printable, readable_config
    config = RulerConfig(workload=workload("poisson", tenant_mix=(
        TenantShare("a", 0.75, 2.0), TenantShare("b", 0.25, 1.0, -1))))
    text = readable_config(_printable(Subject(label="2L1H", layout="2L1H"), config))
    assert "tenant_mix a=0.75:2:0,b=0.25:1:-1" in text and "{" not in text
    assert "  tenants     fair_share True" in text
    assert "tenants " not in readable_config(_printable(Subject(label="2L1H", layout="2L1H"),
                                                        RulerConfig()))


# ---- the study ----------------------------------------------------------------------------
def test_service_per_window_counts_prompts_at_the_first_token_and_outputs_at_theirs():
    a = RequestRecord(index=0, arrival=0.0, prompt_len=100, output_len=3, outcome="completed",
                      first_token_time=9.0, token_times=[9.0, 11.0, 12.0], tenant="a")
    b = RequestRecord(index=1, arrival=1.0, prompt_len=40, output_len=4, outcome="completed",
                      first_token_time=2.0, token_times=[2.0, 3.0], num_output_tokens=4,
                      tenant="b")  # a live client's chunks: 2 tokens each
    dropped = RequestRecord(index=2, arrival=1.0, prompt_len=500, output_len=4,
                            outcome="dropped", end_time=5.0, tenant="b")
    assert service_per_window([a, b, dropped], 10.0) == {"a": [101, 2], "b": [44, 0]}


@pytest.mark.slow
def test_the_tenants_study_runs_quick(tmp_path, capsys):
    from bench.studies.tenants import main as study
    out = tmp_path / "tenants.json"
    assert study(["--quick", "--num-requests", "300", "--out", str(out),
                  "--figures", str(tmp_path)]) == 0
    doc = json.loads(out.read_text())
    assert doc["config"]["quick"] and doc["config"]["seeds"] == [0]
    assert [r["label"] for r in doc["flood"]][:2] == ["2L1H",
                                                      "2L1H --no-fair-share (costliest late first)"]
    for row in doc["flood"]:
        assert 0 <= row["light_goodput_pct"] <= 100 and row["one_tenant_goodput_pct"] >= 0
    assert {r["weights"] for r in doc["weights"]} == {"2:1", "1:1"}
    for row in doc["weights"]:
        assert len(row["windows"]) >= 2 and row["mean_ratio"] > 0
    assert [r["variant"] for r in doc["sheddable"]] == [
        "batch sheddable", "no priorities", "chat alone", "batch sheddable, 0.8 x C",
        "no priorities, 0.8 x C"]
    assert all(r["ok"] is not None for r in doc["starvation"] if r["bounded"])
    out_text = capsys.readouterr().out
    assert "flood:" in out_text and "weights:" in out_text and "starvation:" in out_text
