"""ESP groups over tensor-parallel instances (issue #55): in the simulator a group of tp-k
instances is priced and run (each rank exchanges its 1/k of the heads with the same rank
of the other members, engines/executors/profiles/esp_time.py), `simulate`'s
`--esp-max-degree` reaches the simulated box at any tp, and the torch executor, which has
no such groups, refuses the setting by name.

Covers: engines/executors/profiles/esp_time.py, bench/sim/sim_flags.py, daemon/config.py.
"""
from __future__ import annotations

import pytest

from bench.loadgen.workload import WorkloadRequest
from daemon.config import load_config
from engines.executors.profiles.all_reduce import load_all_reduce
from engines.executors.profiles.esp_time import all_gather_seconds, esp_prefill_time
from engines.executors.profiles.registry import get_profile

PROFILE_70B = "a100-llama3-70b"


def test_a_tp4_groups_exchange_is_one_all_gather_of_one_ranks_heads():
    tp4 = get_profile(f"{PROFILE_70B}@tp4")
    tp8 = get_profile(f"{PROFILE_70B}@tp8")
    assert tp4.kv_bytes_per_token == 2 * tp8.kv_bytes_per_token   # 2 of 8 KV heads, then 1
    n, layers = 8192, tp4.model.layers
    layer_bytes = n * tp4.kv_bytes_per_token // layers
    expected = layers * all_gather_seconds(load_all_reduce(tp4.network_file), 2, layer_bytes)
    two = esp_prefill_time(tp4, n, 2)
    assert two.exchange == pytest.approx(expected)
    # an 8k prompt misses the 70B's interactive TTFT (1.275 s) alone at tp 4, not over two
    assert esp_prefill_time(tp4, n, 1).total > 1.275 > two.total


def _requests() -> list[WorkloadRequest]:
    """Short standard requests every 0.5 s, and one 8,000-token interactive prompt at 2 s."""
    short = [WorkloadRequest(i, 0.5 * i, 512, 16, ttft_slo=5.1, tbt_slo=0.384,
                             slo_class="standard") for i in range(8)]
    long = WorkloadRequest(8, 2.0, 8000, 16, ttft_slo=1.275, tbt_slo=0.256,
                           slo_class="interactive")
    return sorted(short + [long], key=lambda r: r.arrival)


def _simulate(argv: list[str]):
    import argparse

    from bench.ruler.ruler import sim_config
    from bench.sim.box_run import simulate
    from bench.sim.sim_flags import add_sim_flags, sim_settings

    parser = argparse.ArgumentParser()
    add_sim_flags(parser)
    subject, config = sim_settings(parser.parse_args(argv))
    return simulate(sim_config(subject, config), _requests(), keep_records=True).records


@pytest.mark.slow   # two 70B boxes calibrate their performance models (a few seconds)
def test_simulate_esp_over_two_tp4_instances_answers_the_long_prompt_in_time():
    flags = ["--layout", "2A", "--profile", PROFILE_70B, "--tp", "4", "--workload", "mixed-slo"]
    alone = {r.index: r for r in _simulate(flags)}
    grouped = {r.index: r for r in _simulate(flags + ["--esp-max-degree", "2"])}
    assert len(grouped) == 9 and all(r.outcome == "completed" for r in grouped.values())
    assert sorted(grouped[8].esp_group) == [0, 1]           # striped over both instances
    assert not any(r.esp_group for i, r in grouped.items() if i != 8)
    assert not any(r.esp_group for r in alone.values())
    # alone it would miss its TTFT on either instance: shed at once; in a group, in time
    assert alone[8].outcome == "dropped" and alone[8].error_code == "ttft_slo_missed"
    assert grouped[8].ttft() <= 1.275


def test_esp_at_tp_above_1_is_refused_for_the_torch_executor_and_taken_for_the_sim(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[instances]\ndevice = \"cpu\"\ntp = 2\n"
                      "[controller]\nesp_max_degree = 2\n")
    with pytest.raises(ValueError, match=r"controller\.esp_max_degree: .*instances\.tp = 1"):
        load_config(str(config))
    config.write_text("[instances]\nexecutor = \"sim\"\ntp = 4\n"
                      f"profile = \"{PROFILE_70B}\"\n[controller]\nesp_max_degree = 2\n")
    assert load_config(str(config)).controller.esp_max_degree == 2
