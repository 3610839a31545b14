"""The side commands as a user meets them: a missing extra, a wrong flag, short runs.

Covers: daemon/cli.py, daemon/generate_cmd.py, daemon/tiny_model_cmd.py.
"""
from __future__ import annotations

import sys

import pytest

from daemon.cli import main, unrecognized, build_parser, verb_parser
from bench.ruler.ruler import RulerConfig, SeedCapacity, Subject
from bench.ruler.short_run import STEADY_MIN_MEASURED, above_bound, too_short
from bench.sim.simulate_cmd import (
    CapacityAnswer, capacity_table, capacity_warnings, readable_config, _printable,
)


def test_reproduce_without_matplotlib_names_the_extra_in_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert main(["reproduce", "fig9", "--quick", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "bench" in err and "pip install -e '.[bench]'" in err
    assert not list(tmp_path.iterdir())  # nothing simulated


@pytest.mark.parametrize("argv, prog, hint", [
    (["serve", "--prt", "9000"], "ascendra serve", "did you mean --port?"),
    (["plan", "--quik"], "ascendra plan", "did you mean --quick?"),
    (["capacity", "--measurd", "40"], "ascendra capacity", "did you mean --measured?"),
    (["serve", "--bogus"], "ascendra serve", "unrecognized arguments: --bogus"),
    (["simulate", "--qps", "x"], "ascendra simulate", "argument --qps: invalid float value"),
    ([], "ascendra", "required: COMMAND"),
])
def test_a_wrong_flag_is_one_short_line_naming_the_closest_flag(argv, prog, hint, capsys):
    """As git's: the line that helps, last and alone -- not 31 lines of usage above it."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"{prog}: error: ") and hint in line
    assert line.endswith(f"see {prog} --help") and "usage:" not in line


def test_no_suggestion_when_nothing_is_close():
    assert "did you mean" not in unrecognized(["--zzzzzz"],
                                              verb_parser(build_parser(), "serve"))


def test_short_runs_and_numbers_above_a_hard_bound_are_flagged():
    assert too_short(STEADY_MIN_MEASURED) is None and too_short(4500) is None
    assert "short run" in too_short(300)
    assert above_bound(13.0, 14.0, "bound") is None and above_bound(14.0, 14.0, "b") is None
    assert "above the bound for 90 % goodput (14.00 QPS)" in above_bound(
        17.0, 14.0, "bound for 90 % goodput")


def _answer(measured: int, capacity: float) -> CapacityAnswer:
    seed = SeedCapacity(seed=0, capacity_qps=capacity, fair_capacity_qps=capacity * 0.9,
                        bracketed=True, points=[])
    return CapacityAnswer(subject=Subject(label="2L1H", layout="2L1H"),
                          config=RulerConfig(measured=measured, seeds=(0,)), ceiling_qps=10.0,
                          ceiling_target_qps=14.0, fair_ceiling_qps=13.0,
                          prompt_class_bounds=(), mean_qps=capacity, min_qps=capacity,
                          max_qps=capacity, fair_mean_qps=capacity * 0.9,
                          fair_min_qps=capacity * 0.9, fair_max_qps=capacity * 0.9,
                          seeds=[seed])


def test_capacity_prints_a_short_table_with_the_ceilings_and_warns_on_short_runs():
    steady = _answer(4500, 11.0)
    assert capacity_warnings(steady) == []
    table = capacity_table(steady)
    assert table.startswith("capacity of 2L1H") and len(table.splitlines()) <= 8
    assert "11.00" in table and "110 %" in table and "14.00 QPS" in table
    assert "WARNING" not in table and "steady_state: false" not in table

    short = _answer(300, 17.0)
    warnings = capacity_warnings(short)
    assert any("short run" in w for w in warnings)
    assert any("17.00 QPS is above the bound for 90 % goodput" in w for w in warnings)
    import msgspec
    short = msgspec.structs.replace(short, steady_state=False, warnings=warnings)
    table = capacity_table(short)
    line = next(l for l in table.splitlines() if l.strip().startswith("0 "))
    assert line.endswith("!")  # the number above the bound is marked on its own line
    assert "steady_state: false" in table and table.count("WARNING") == len(warnings)
    assert msgspec.json.decode(msgspec.json.encode(short))["steady_state"] is False


def test_capacity_configuration_is_readable_not_a_blob():
    text = readable_config(_printable(Subject(label="2L1H", layout="2L1H"), RulerConfig()))
    lines = text.splitlines()
    assert lines[0] == "configuration:" and all(len(l) < 400 for l in lines)
    assert "{" not in text and "measured 4500" in text and "routing prefix_aware" in text
    assert "onoff" not in text  # only what this workload uses


def test_simulate_says_its_times_are_simulated_and_where_it_wrote(capsys, tmp_path):
    result, records = tmp_path / "result.json", tmp_path / "records.jsonl"
    assert main(["simulate", "--layout", "1xsarathi", "--num-requests", "20", "--qps", "5",
                 "--sim-latency", "constant:0.01", "--json", str(result),
                 "--records", str(records)]) == 0
    out = capsys.readouterr().out
    assert "simulated seconds" in out
    assert f"result written to {result}" in out and result.exists()
    assert f"records written to {records}" in out and len(records.read_text().splitlines()) == 20


def test_the_performance_models_error_reads_alike_everywhere_in_a_summary():
    from bench.records.schema import Percentiles, RunResult
    from bench.records.summary_table import plain_summary
    none = Percentiles()
    result = RunResult(
        config={}, num_requests=1, duration_s=1.0, ttft_slo_s=1.0, tbt_slo_s=0.15,
        goodput_pct=100.0, goodput_rps=1.0, throughput_rps=1.0, output_tok_s=1.0, ttft_s=none,
        tbt_s=none, mean_tbt_s=none, sched_delay_s=none, p99_tbt_s=None, good=1, completed=1,
        dropped=0, errored=0, lost=0, offloaded=0, perf_model_mape=0.0053,
        per_instance=[{"id": 0, "role": "lp", "served": 1, "perf_model_mape": 0.0053},
                      {"id": 1, "role": "hp", "served": 0, "perf_model_mape": None}])
    text = plain_summary(result)
    assert "0.5 %" in text and "perf model MAPE 0.5 %" in text and "MAPE -" in text
    assert "0.0053" not in text and "None" not in text


def test_a_fleet_run_prints_only_the_settings_it_used(capsys):
    assert main(["simulate", "--boxes", "2", "--box-layouts", "1xsarathi,1xsarathi",
                 "--num-requests", "30", "--qps", "8", "--sim-latency", "constant:0.01"]) == 0
    settings = capsys.readouterr().err.split("fleet of ", 1)[1].splitlines()[0]
    import json
    used = json.loads(settings)
    assert used["num_requests"] == 30 and used["qps"] == 8.0 and used["boxes"] == ["1xsarathi"] * 2
    assert not {"seeds", "measured", "tolerance", "config"} & set(used)
