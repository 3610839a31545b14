"""Several models on one box in the simulator (MuxServe): the placements `plan --model-mix`
searches, the models drawn by their shares, a multiplexed box's records naming their
models, and the plan's answer on a small run.

Covers: bench/ruler/model_mix.py, bench/ruler/plan_mix.py, bench/ruler/plan_cmd.py, bench/sim/sim_instances.py, bench/studies/multi_model.py.
"""
from __future__ import annotations

import json

import pytest

from bench.loadgen.workloads import build_requests, workload
from bench.ruler.model_mix import (
    Group, MixRun, Placement, assign_models, candidate_placements, parse_mix, per_model,
    popularity_split, simulate,
)
from bench.sim.sim_instances import SimConfig, build_instance, mux_pool_units
from daemon.cli import main
from engines.executors.profiles.registry import get_profile

MIX = {"A": 0.8, "B": 0.2}


def test_the_mix_is_named_shares_normalised():
    assert parse_mix("A=4,B=1") == {"A": 0.8, "B": 0.2}
    for bad in ("A=0.8", "A=x,B=1", "A=0,B=1", "=1,B=1"):
        with pytest.raises(ValueError, match="--model-mix"):
            parse_mix(bad)


def test_candidates_are_every_dedicated_split_multiplexed_and_the_baseline():
    labels = [p.label for p in candidate_placements(3, MIX)]
    assert labels == ["A:2xsarathi + B:1xsarathi", "A:1L1H + B:1xsarathi",
                      "A:1xsarathi + B:2xsarathi", "A:1xsarathi + B:1L1H",
                      "A+B:3xsarathi", "A+B:2L1H", "A:2xvllm-v1 + B:1xvllm-v1"]
    assert popularity_split(4, MIX) == (3, 1) and popularity_split(2, MIX) == (1, 1)
    assert popularity_split(1, MIX) is None


def test_requests_are_drawn_by_share():
    requests = build_requests(workload("poisson"), rate=4, num_requests=1000, seed=0,
                              max_model_len=8192)
    drawn = assign_models(requests, MIX, seed=0)
    share = sum(r.model == "A" for r in drawn) / len(drawn)
    assert 0.76 < share < 0.84
    assert assign_models(requests, MIX, seed=0) == drawn  # seeded


def test_the_pool_is_what_the_gpu_holds_after_both_weights():
    profile = get_profile("a100-llama3-8b")
    units = mux_pool_units({"A": profile, "B": profile}, 16)
    alone = profile.num_kv_blocks(16)
    blocks = units // (profile.model.layers * profile.model.kv_heads)
    second = profile.weight_bytes // (profile.kv_bytes_per_token * 16)
    assert blocks == pytest.approx(alone - second, abs=1)
    sim = build_instance(SimConfig(layout_modes=("sarathi",),
                                   models=(("A", "a100-llama3-8b"), ("B", "a100-llama3-8b"))),
                         0, "sarathi")
    assert sim.core.ready(0, "sim").models == ["A", "B"]


@pytest.mark.slow
def test_a_multiplexed_box_serves_both_models_and_names_them_in_its_records():
    run = MixRun(mix=tuple(MIX.items()),
                 profiles=(("A", "a100-llama3-8b"), ("B", "a100-llama3-8b")), num_requests=60)
    records = simulate(Placement((Group(("A", "B"), "2xsarathi"),)), run, 2.0)
    numbers = per_model(records, ["A", "B"], run.slo)
    assert numbers["A"]["requests"] + numbers["B"]["requests"] == 60
    assert all(r.outcome == "completed" for r in records)
    assert numbers["A"]["goodput_pct"] > 90 and numbers["B"]["goodput_pct"] > 90


@pytest.mark.slow
def test_plan_with_a_model_mix_recommends_a_placement(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--gpus", "2", "--model-mix", "A=0.8,B=0.2", "--measured", "40",
                 "--workers", "1", "--json", str(out)]) == 0
    answer = json.loads(out.read_text())
    labels = [c["placement"] for c in answer["candidates"]]
    assert "A+B:2xsarathi" in labels and "A:1xsarathi + B:1xsarathi" in labels
    assert answer["recommended"] in labels
    assert "<- recommended" in capsys.readouterr().out


def test_plan_refuses_a_profile_for_a_model_not_in_the_mix(capsys):
    assert main(["plan", "--gpus", "2", "--model-mix", "A=0.8,B=0.2",
                 "--model-profile", "C=a100-llama3-8b"]) == 2
    assert "--model-profile" in capsys.readouterr().err


def test_the_study_prints_its_tables_from_its_result():
    from bench.studies.multi_model import table
    rows = [{"kind": k, "gpus": 2, "seed": s, "placement": k, "capacity_qps": c + s}
            for s in (0, 1) for k, c in (("dedicated", 3.0), ("vllm-v1 dedicated", 3.0),
                                         ("multiplexed", 5.0))]
    costs = [{"kind": k, "gpus": 2, "seed": s, "qps": 3.0,
              "A": {"goodput_pct": a, "p99_ttft_s": 1.0, "mean_tbt_s": 0.05},
              "B": {"goodput_pct": 99.0, "p99_ttft_s": 1.0, "mean_tbt_s": 0.05}}
             for s in (0, 1) for k, a in (("dedicated", 95.0), ("multiplexed", 97.0))]
    text = table({"capacity": rows, "popular_model_cost": costs, "gpus": [2], "seeds": [0, 1]})
    assert "| 2 | multiplexed (multiplexed) | 5.00 / 6.00 | 5.50 | 1.57 |" in text
    assert "95.0 / 97.0 %" in text
