"""The timing-sensitivity study: the same requests at several message delays, its default
delay's run being exactly what `ascendra simulate` reports for the same flags.

Covers: bench/studies/timing_sensitivity.py.
"""
from __future__ import annotations

import json

import pytest

from daemon.cli import main as ascendra
from bench.studies.timing_sensitivity import main as sensitivity

FLAGS = ["--layout", "3xvllm-v1", "--chunk-size", "512", "--drop-expired", "--workload",
         "poisson", "--qps", "40", "--num-requests", "120", "--num-kv-blocks", "300"]


@pytest.mark.slow
def test_the_default_delay_is_the_simulators_run_and_other_delays_move_only_timing(tmp_path):
    out = tmp_path / "s.json"
    assert sensitivity([*FLAGS, "--seeds", "3", "--ipc-delays", "0.0005,0.0005,0.003",
                        "--json", str(out)]) == 0
    (seed,) = json.loads(out.read_text())["seeds"]
    same, again, slower = seed["runs"]
    assert same == again                                   # deterministic
    assert seed["spread_points"] == round(abs(same["goodput_pct"] - slower["goodput_pct"]), 2)
    plain = tmp_path / "sim.json"
    assert ascendra(["simulate", *FLAGS, "--seed", "3", "--json", str(plain)]) == 0
    result = json.loads(plain.read_text())
    assert same["goodput_pct"] == result["goodput_pct"]
    assert same["preemptions"] == [i["preemptions"] for i in result["per_instance"]]
    assert sum(same["preemptions"]) > 0                    # KV pressure: the regime it probes
