"""bench/micro/sim_floor.py: a run's profile grouped by the work a rewrite would replace,
and the floor printed beside the target.

Covers: bench/micro/sim_floor.py.
"""
import pytest

from bench.micro import sim_floor

PROFILE = """\
<module> (daemon/cli.py:1);Simulation.run (bench/sim/simulator.py:91);Scheduler.update (engines/scheduler.py:500) 30
<module> (daemon/cli.py:1);Scheduler.update (engines/scheduler.py:513);_chain (policies/prefix_hash.py:72) 10
<module> (daemon/cli.py:1);_Held.record (daemon/core/prefix_index.py:48) 5
<module> (daemon/cli.py:1);prompt_token_ids (bench/loadgen/workload.py:131) 5
<module> (daemon/cli.py:1);EventHeap.run_next (bench/sim/event_heap.py:27) 50
"""


def test_samples_are_grouped_by_their_innermost_frame(tmp_path):
    path = tmp_path / "profile.txt"
    path.write_text(PROFILE)
    shares = sim_floor.profile_shares(str(path))
    assert shares == pytest.approx({
        "per-token passes": 0.30, "block names": 0.10, "KV blocks and prefix index": 0.05,
        "workload prompts": 0.05, sim_floor.REST: 0.50})


@pytest.mark.slow
def test_the_floor_keeps_the_rest_and_is_under_the_run(tmp_path, capsys):
    path = tmp_path / "profile.txt"
    path.write_text(PROFILE)
    sim_floor.main([str(path), "--baseline-cpu", "100", "--", "--layout", "2L1H",
                    "--workload", "poisson", "--num-requests", "40", "--qps", "4"])
    lines = capsys.readouterr().out.splitlines()
    cpu = float(lines[0].split()[1])
    rest = next(line for line in lines if line.startswith("the rest")).split()
    assert float(rest[-1]) == float(rest[-2]) == pytest.approx(0.5 * cpu, abs=0.01)
    floor = float(lines[-1].split()[1])
    assert 0.5 * cpu - 0.01 <= floor <= cpu
    assert "3x is 33.33 s (over the floor)" in lines[-1]


def test_every_grouped_name_is_still_in_the_tree():
    """A function renamed since would silently leave its group for `the rest`."""
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    source = "\n".join(p.read_text() for folder in ("bench", "daemon", "engines", "ipc", "policies")
                       for p in (root / folder).rglob("*.py"))
    for names in sim_floor.GROUPS.values():
        for name in names:
            last = name.strip().removesuffix(".<locals>").rstrip(".").split(".")[-1]
            assert f"def {last}(" in source or f"class {last}" in source, name
