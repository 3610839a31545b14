"""The role-timeline study (bench/studies/role_timeline.py): the HP count per window follows
the role changes, and a run gives every layout the same requests.

Covers: bench/studies/role_timeline.py.
"""
from __future__ import annotations

import pytest

from bench.studies.role_timeline import RoleChange, _hps_by_window, role_timeline


def test_the_hp_count_per_window_follows_the_changes_in_time_order():
    changes = [RoleChange(time=25.0, instance=2, old="hp", new="lp", reason="r"),
               RoleChange(time=12.0, instance=2, old="lp", new="hp", reason="r"),
               RoleChange(time=15.0, instance=0, old="lp", new="hp", reason="r")]
    # windows start at 0, 10, 20, 30: a change counts from the first window after it
    assert _hps_by_window("3A", changes, 4, 10.0) == [0, 0, 2, 1]


@pytest.fixture(scope="module")
def timeline():
    return role_timeline(["3A", "3L0H"], qps=9.0, seed=0, n=400, window=10.0, workers=1)


@pytest.mark.slow
def test_a_timeline_runs_every_layout_on_the_same_requests(timeline):
    dynamic, static = timeline.layouts
    assert len(dynamic.window_goodput_pct) == len(static.window_goodput_pct)
    assert len(dynamic.window_hps) == len(dynamic.window_goodput_pct)
    assert static.window_hps == [] and static.role_changes == []
    assert set(dynamic.phase_goodput_pct) == set(static.phase_goodput_pct)


@pytest.mark.slow
def test_the_timeline_figure_is_drawn(timeline, tmp_path):
    pytest.importorskip("matplotlib")       # the `bench` extra
    from bench.studies.role_timeline import figure
    figure(timeline, tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").stat().st_size > 10_000
