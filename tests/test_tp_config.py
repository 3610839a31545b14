"""`serve --tp K` settings: each instance takes K GPUs of `gpus` (ranges allowed), one
degree for every model or one per model, and errors name the setting.

Covers: daemon/config.py, daemon/model_plan.py.
"""
from __future__ import annotations

import argparse

import pytest

from daemon.config import add_config_flags, config_from_args, load_config


def test_tp2_deals_two_gpus_to_each_instance_of_a_range():
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    args = parser.parse_args(["--layout", "2L1H", "--tp", "2", "--gpus", "0-5"])
    (plan,) = config_from_args(args).model_plans()
    assert plan.tp == 2
    assert [spec.gpus for spec in plan.instances] == [(0, 1), (2, 3), (4, 5)]


def test_too_few_gpus_for_the_degree_is_an_error_naming_gpus():
    with pytest.raises(ValueError, match=r"needs 6 GPUs, gpus lists 4"):
        load_config(overrides={"layout": "2L1H", "tp": 2, "gpus": [0, 1, 2, 3]})


def test_one_degree_per_model_and_gpus_run_on_across_the_models():
    config = load_config(overrides={"model": ["", ""], "served_model_name": ["a", "b"],
                                    "layout": ["1xsarathi", "2xsarathi"], "tp": [2, 1],
                                    "gpus": [0, 1, 2, 3]})
    first, second = config.model_plans()
    assert (first.tp, second.tp) == (2, 1)
    assert [s.gpus for s in first.instances + second.instances] == [(0, 1), (2,), (3,)]
    with pytest.raises(ValueError, match=r"instances.tp: 3 degree\(s\) for 2 models"):
        load_config(overrides={"model": ["", ""], "served_model_name": ["a", "b"],
                               "tp": [1, 2, 4]})


def test_gpus_per_instance_must_agree_with_tp():
    with pytest.raises(ValueError, match="instances.gpus_per_instance: 3 conflicts with tp 2"):
        load_config(overrides={"tp": 2, "gpus_per_instance": 3, "gpus": [0, 1, 2, 3, 4, 5]})
