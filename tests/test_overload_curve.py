"""The overload study's curve (bench/studies/overload.py): every setting at every multiple
of a capacity, each rate against its own best baseline, nothing lost.

Covers: bench/studies/overload.py.
"""
from __future__ import annotations

import pytest

from bench.ruler.capacity_table import parse_settings
from bench.studies.overload import main, overload


@pytest.mark.slow
def test_a_curve_rates_every_setting_against_the_best_baseline_at_each_load():
    subjects = parse_settings(["2L1H", "3xvllm-v0@8192+drops"])
    rows = overload(subjects, [(9.0, 1.0), (18.0, 2.0)], minutes=0.2, seed=0, workers=1)
    assert [(r.layout, r.load) for r in rows] == [
        ("2L1H", 1.0), ("3xvllm-v0@8192 drops", 1.0),
        ("2L1H", 2.0), ("3xvllm-v0@8192 drops", 2.0)]
    for row in rows:
        assert row.lost == 0 and row.completed + row.dropped + row.errored == row.requests
        assert row.good_per_s == pytest.approx(row.within_slo * row.qps / row.requests,
                                               abs=1e-3)
    assert [r.ratio_to_best_baseline for r in rows if "vllm" in r.layout] == [1.0, 1.0]
    assert all(len(r.quartile_goodput_pct) == 4 for r in rows)   # who pays, by prompt length


def test_settings_without_a_baseline_are_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--settings", "2L1H,3A", "--capacity", "9"])
    assert exit_.value.code == 2 and "name no baseline" in capsys.readouterr().err
