"""`ascendra plan`: every split of the GPUs is simulated, the best is recommended.

Covers: bench/ruler/plan.py, bench/ruler/plan_cmd.py.
"""
from __future__ import annotations

import json

import pytest

from daemon.cli import main
from bench.ruler.plan import candidate_layouts, zero_note
from bench.ruler.ruler import Point, SeedCapacity


BASELINES = ["xsarathi", "xvllm-v0", "xvllm-v1", "xsglang"]


def test_every_split_and_every_baseline_are_candidates():
    assert candidate_layouts(3) == ["3L0H", "2L1H", "1L2H", "3A", "2P1D", "1P2D",
                                    *(f"3{b}" for b in BASELINES)]
    assert candidate_layouts(1) == ["1L0H", *(f"1{b}" for b in BASELINES)]
    with pytest.raises(ValueError, match="--gpus"):
        candidate_layouts(0)


@pytest.mark.slow
def test_plan_recommends_the_candidate_with_the_highest_capacity(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--gpus", "2", "--measured", "60", "--trace", "arxiv",
                 "--max-model-len", "2048", "--json", str(out)]) == 0
    answer = json.loads(out.read_text())
    capacities = {c["layout"]: c["capacity_qps"] for c in answer["candidates"]}
    assert set(capacities) == {"2L0H", "1L1H", "2A", "1P1D", *(f"2{b}" for b in BASELINES)}
    assert answer["recommended"] == max(capacities, key=capacities.get)
    assert all(c["fraction_of_ceiling"] > 0 for c in answer["candidates"])  # (a short run)
    captured = capsys.readouterr()
    printed = captured.out
    # progress from the start, before the first layout's search ends
    assert captured.err.splitlines()[0].startswith("plan: 8 layouts of 2 GPUs")
    assert f"{answer['recommended']}" in printed and "<- recommended" in printed
    assert "hardware ceiling" in printed
    assert "ranked by fair capacity (every prompt-length class >= 80 %), then capacity" in printed
    # 60 measured requests are no steady state: said in the output and the JSON
    assert answer["steady_state"] is False and "WARNING: short run" in printed


def test_plan_quick_is_a_short_run():
    from bench.ruler.plan_cmd import QUICK_MEASURED
    from bench.ruler.short_run import too_short
    from daemon.cli import build_parser, verb_parser
    args = verb_parser(build_parser(), "plan").parse_args(["--quick"])
    assert args.quick and args.measured is None
    assert too_short(QUICK_MEASURED)  # --quick says it is a first look


def _point(qps: float, holds: bool, fair: bool = False) -> Point:
    return Point(qps=qps, holds=holds, goodput_pct=0.0, window_goodput_pct=[],
                 stopped_early=False, offloaded=0, dropped=0, wall_s=0.0, fair_holds=fair)


def test_a_zero_in_the_plan_says_why():
    """`2P1D 0.00 0.00` read as a bug; it means no rate tried held (issue #62)."""
    none = SeedCapacity(0, 0.0, [_point(8.0, False), _point(0.25, False)], False, 0.0, False)
    assert zero_note(none, 90.0, 0.8) == "holds 90 % at no rate tried (down to 0.25 QPS)"
    unfair = SeedCapacity(0, 2.0, [_point(1.0, True), _point(2.0, True), _point(4.0, False)],
                          True, 0.0, False)
    assert zero_note(unfair, 90.0, 0.8) == ("no rate tried holds every class at 80 % (down "
                                            "to 1.00 QPS)")
    found = SeedCapacity(0, 2.0, [_point(2.0, True, True), _point(4.0, False)], True, 2.0)
    assert zero_note(found, 90.0, 0.8) == ""
