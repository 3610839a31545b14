"""bench/studies/measured_loop.py's interleaved check: the simulation's means are held to
the targets against the live means (goodput within 3 points, the rest within 10 %), each
side's spread over the rounds is kept, and the loop is either one profile or rounds.

Covers: bench/studies/measured_loop.py.
"""
from __future__ import annotations

import json

import pytest

from bench.studies.measured_loop import aggregate, main, report


def _figures(goodput=100.0, p50=0.010, p90=0.020, tbt=0.005) -> dict:
    return {"goodput_pct": goodput, "p50_ttft_s": p50, "p90_ttft_s": p90, "mean_tbt_s": tbt,
            "completed": 400}


def _run(k: int, live_tbt: float, minute_tbt: float, before_goodput: float = 100.0) -> dict:
    return {"round": k, "rate": 13.0, "speed": 1.0, "live": _figures(tbt=live_tbt),
            "before": _figures(goodput=before_goodput, tbt=live_tbt),
            "around": _figures(tbt=1.12 * live_tbt), "minute": _figures(tbt=minute_tbt),
            "seconds": _figures(tbt=live_tbt)}


def test_the_means_over_the_rounds_are_held_to_the_targets():
    rows = [_run(1, 0.005, 0.0052, before_goodput=96.0), _run(2, 0.006, 0.0063,
                                                               before_goodput=96.0)]
    (entry,) = aggregate(rows)
    assert entry["rounds"] == 2
    assert entry["live"]["mean_tbt_s"]["mean"] == pytest.approx(0.0055)
    assert entry["live"]["mean_tbt_s"]["sd"] == pytest.approx(0.000707, rel=1e-3)
    assert entry["minute_error"]["mean_tbt_s"] == pytest.approx(0.0455, abs=1e-4)
    assert entry["minute_within"]
    assert not entry["around_within"]       # 12 % over on mean TBT
    assert entry["before_error"]["goodput_pct"] == pytest.approx(-4.0)
    assert not entry["before_within"]       # 4 goodput points under
    text = report(rows, [entry])
    assert "NOT within" in text and "  within" in text


def test_the_loop_is_one_profile_or_rounds_not_both_nor_neither(tmp_path):
    for argv in ([], ["--profile", "p.json", "--rounds", "2"],
                 ["--profile", "p.json", "--capacity-fractions", "0.5"]):
        with pytest.raises(SystemExit) as exit_:
            main([*argv, "--out", str(tmp_path)])
        assert exit_.value.code == 2


@pytest.mark.slow
def test_one_round_runs_end_to_end_and_reports_every_side(tmp_path):
    """The real thing, small: two profiles of the tiny model around one round of a live
    daemon under the load generator, each run simulated four ways."""
    out = tmp_path / "loop"
    assert main(["--rounds", "1", "--repeats", "1", "--rates", "4", "--num-requests", "12",
                 "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    (run,) = summary["runs"]
    assert run["round"] == 1 and run["rate"] == 4.0 and run["speed"] > 0
    for side in ("live", "before", "around", "minute", "seconds"):
        assert run[side]["completed"] == 12
    assert (out / "round-1" / "steps_4" / "steps-0.jsonl").stat().st_size > 0
    assert "mean   seconds" in (out / "report.txt").read_text()
