"""The long-context study (bench/studies/long_context.py): its layouts are the ruler's
settings with an optional ESP suffix, and its capacity search reports the highest short
rate that held with each class's goodput at every rate tried.

Covers: bench/studies/long_context.py.
"""
from __future__ import annotations

import pytest

from bench.studies.long_context import esp_settings, mixed_capacity
from daemon.core.esp_groups import EspSettings


def test_a_study_layout_is_a_ruler_setting_with_an_optional_esp_suffix():
    assert esp_settings("2L1H+esp3:40000") == ("2L1H", EspSettings(max_degree=3, min_tokens=40_000))
    assert esp_settings("3xvllm-v0@8192+drops") == ("3xvllm-v0@8192+drops", EspSettings())


@pytest.mark.slow  # a few short simulations
def test_the_capacity_is_the_highest_short_rate_whose_short_class_held():
    row = mixed_capacity(("3xsarathi", 0.05, 40.0, 15.0, (0,), 90.0, 4.0, 0.3, 3))
    points = row["points"]
    assert len(points) == 3 and all(p["lost"] == 0 and p["long_requests"] == 2
                                    for p in points)
    held = [p["short_qps"] for p in points if p["short_goodput_pct"] >= 90.0]
    assert row["capacity_short_qps"] == round(max(held, default=0.0), 3)
    if held:
        assert row["at_capacity"]["short_qps"] == max(held)
