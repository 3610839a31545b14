"""`ascendra plan`: every split of the GPUs is simulated, the best is recommended."""
from __future__ import annotations

import json

import pytest

from bench.cli import main
from bench.ruler.plan import candidate_layouts


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
    # 60 measured requests are no steady state: said in the output and the JSON
    assert answer["steady_state"] is False and "WARNING: short run" in printed


def test_plan_quick_is_a_short_run():
    from bench.plan_cmd import QUICK_MEASURED
    from bench.ruler.short_run import too_short
    from bench.cli import build_parser, verb_parser
    args = verb_parser(build_parser(), "plan").parse_args(["--quick"])
    assert args.quick and args.measured is None
    assert too_short(QUICK_MEASURED)  # --quick says it is a first look
