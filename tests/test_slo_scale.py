"""A model's own SLOs (engines/executors/profiles/slo_scale.py, `--slo-scale`): a model over
several GPUs is held to the default SLOs times its isolated latency over the 8B's; a model
that fits one GPU keeps the paper's SLOs, so its runs are what they were.

`serve` takes the same defaults from the same place (daemon/slo_defaults.py): its sim
executor's profile is served at the SLOs it is simulated at.

Covers: engines/executors/profiles/slo_scale.py, daemon/slo_defaults.py, daemon/config.py, bench/sim/sim_flags.py, bench/studies/tp_capacity.py.
"""
from __future__ import annotations

import argparse

import msgspec
import pytest

from bench.loadgen.workloads import SLO_CLASSES
from bench.sim.sim_flags import add_sim_flags, sim_settings
from bench.sim.simulate_cmd import _printable, readable_config
from bench.studies.tp_capacity import TABLES, is_ascendra
from daemon.config import ServeConfig, add_config_flags, config_from_args, load_config
from daemon.config_toml import render_toml
from daemon.core.controller_config import SloConfig
from engines.executors.profiles import get_profile
from engines.executors.profiles.registry import PROFILES
from engines.executors.profiles.slo_scale import SloScale, isolated_seconds, slo_scale


def settings(*flags: str):
    p = argparse.ArgumentParser()
    add_sim_flags(p)
    return sim_settings(p.parse_args(list(flags)))


def serve_config(*flags: str) -> ServeConfig:
    """The configuration `ascendra serve FLAGS` runs with."""
    p = argparse.ArgumentParser()
    p.add_argument("--config")
    add_config_flags(p)
    return config_from_args(p.parse_args(list(flags)))


def test_a_model_that_fits_one_gpu_keeps_the_default_slos():
    for name, profile in PROFILES.items():
        if profile.model.layers < 80:  # every profile but the 70Bs fits one 80 GB GPU
            assert slo_scale(name) == SloScale(), name
    _, config = settings("--profile", "a100-llama3-8b", "--tp", "2", "--workload", "mixed-slo")
    assert config.slo == SloConfig() and config.workload.slo_classes == SLO_CLASSES


def test_a_70b_is_held_to_its_isolated_latency_over_the_8bs_at_every_degree():
    scale = slo_scale("a100-llama3-70b")
    # timed alone at tp 4, the smallest degree holding a batch (tp 2 holds 21k tokens)
    prefill, decode = isolated_seconds(get_profile("a100-llama3-70b@tp4"))
    ref_prefill, ref_decode = isolated_seconds(get_profile("a100-llama3-8b"))
    assert scale.ttft == round(prefill / ref_prefill, 2) and 2 < scale.ttft < 3
    assert scale.tbt == round(decode / ref_decode, 2) and 2 < scale.tbt < 3
    assert "at tp 4" in scale.basis
    assert all(slo_scale(f"a100-llama3-70b@tp{k}") == scale for k in (2, 4, 8))
    # never tighter than the paper's: an H100 prefills a 70B faster than an A100 an 8B
    assert slo_scale("h100-llama2-70b").ttft == 1.0


def test_the_run_uses_the_scaled_slos_and_classes_unless_told():
    scale = slo_scale("a100-llama3-70b")
    _, config = settings("--profile", "a100-llama3-70b", "--tp", "8", "--workload", "mixed-slo")
    assert config.slo.ttft_slo == pytest.approx(SloConfig().ttft_slo * scale.ttft)
    assert config.slo.tbt_slo == pytest.approx(SloConfig().tbt_slo * scale.tbt)
    interactive = config.workload.slo_classes[0]
    assert interactive.ttft_slo == pytest.approx(SLO_CLASSES[0].ttft_slo * scale.ttft)
    assert config.slo_scale == scale
    # a target given on the command line is kept; --slo-scale 1 is the 8B's SLOs
    _, told = settings("--profile", "a100-llama3-70b", "--tp", "4", "--ttft-slo", "3")
    assert told.slo.ttft_slo == 3 and told.slo.tbt_slo == pytest.approx(0.15 * scale.tbt)
    _, plain = settings("--profile", "a100-llama3-70b", "--tp", "4", "--slo-scale", "1")
    assert plain.slo == SloConfig()
    _, each = settings("--profile", "a100-llama3-8b", "--slo-scale", "2,3")
    assert (each.slo.ttft_slo, each.slo.tbt_slo) == pytest.approx((2.0, 0.45))


def test_a_bad_scale_is_an_error_naming_the_flag():
    with pytest.raises(ValueError, match="--slo-scale"):
        settings("--slo-scale", "fast")
    with pytest.raises(ValueError, match="--slo-scale"):
        settings("--slo-scale", "0")


def test_serve_holds_a_70b_to_the_slos_it_is_simulated_at():
    for layout, tp in (("2A", "4"), ("1A", "8")):
        served = serve_config("--executor", "sim", "--profile", "a100-llama3-70b", "--tp", tp,
                              "--layout", layout)
        _, simulated = settings("--layout", layout, "--profile", "a100-llama3-70b", "--tp", tp)
        assert served.slo == simulated.slo
        assert served.slo.ttft_slo == pytest.approx(1.0 * slo_scale("a100-llama3-70b").ttft)
    # a model that fits one GPU, a constant latency and the torch executor: the paper's
    assert serve_config("--executor", "sim", "--profile", "a100-llama3-8b").slo == SloConfig()
    assert serve_config("--executor", "sim", "--sim-latency", "constant:0.01").slo == SloConfig()
    assert serve_config().slo == SloConfig()


def test_serve_keeps_the_targets_it_is_given_and_takes_the_scale_setting(tmp_path):
    scale = slo_scale("a100-llama3-70b")
    box = ("--executor", "sim", "--profile", "a100-llama3-70b", "--tp", "4", "--layout", "2A")
    told = serve_config(*box, "--ttft-slo", "3")
    assert (told.slo.ttft_slo, told.slo.tbt_slo) == pytest.approx((3.0, 0.15 * scale.tbt))
    toml = tmp_path / "ascendra.toml"
    toml.write_text("[slo]\ntbt_slo = 0.2\n")
    from_file = serve_config("--config", str(toml), *box)
    assert (from_file.slo.ttft_slo, from_file.slo.tbt_slo) == pytest.approx((scale.ttft, 0.2))
    assert serve_config(*box, "--slo-scale", "1").slo == SloConfig()
    assert serve_config("--slo-scale", "2,3").slo == SloConfig(ttft_slo=2.0, tbt_slo=0.45)
    # --print-config's file serves at the same SLOs (its targets read as given: not rescaled)
    served = serve_config(*box)
    toml.write_text(render_toml(served))
    assert load_config(str(toml)) == served
    with pytest.raises(ValueError, match="instances.slo_scale: 'fast'"):
        serve_config(*box, "--slo-scale", "fast")


def test_the_printed_configuration_names_the_scale_and_why():
    subject, config = settings("--layout", "2A", "--profile", "a100-llama3-70b", "--tp", "4")
    slo_line = next(line for line in readable_config(_printable(subject, config)).splitlines()
                    if line.strip().startswith("slo "))
    assert "ttft_slo 2.55" in slo_line and "scale.ttft 2.55" in slo_line
    assert "a100-llama3-70b at tp 4 alone" in slo_line


def test_the_tp_tables_compare_ascendra_rows_with_baseline_rows_at_every_degree():
    for table in TABLES.values():
        for group in table.groups:
            labels = [r.label for r in group.rows]
            assert any(is_ascendra(x) for x in labels) and not all(map(is_ascendra, labels))
            assert {x.rsplit("@")[-1] for x in labels} == {x.rsplit("@")[-1] for x in labels
                                                         if is_ascendra(x)}


def test_a_tp_search_started_near_its_answer_is_cached_and_reported_as_its_row(tmp_path):
    """Later seeds start at seed 0's capacity (`Row.start`): where a search starts changes
    its runs, not its answer, so the cache and the report name the row's plain command."""
    from bench.ruler.ruler import SeedCapacity
    from bench.studies.results_tables import Protocol
    from bench.studies.tp_capacity import Search, _key, jobs_of, load_cache, report

    table = TABLES["tp70b"]
    protocol = Protocol(measured=1500, seeds=(0, 1), tolerance=0.05)
    jobs = jobs_of([table], protocol, only="^poisson 2A @tp4$")
    assert [seed for _, seed in jobs] == [0, 1] and all("--start-qps 3.95" in c for c, _ in jobs)
    flags = "--layout 2A --profile a100-llama3-70b --tp 4 --workload poisson"
    cache = tmp_path / "searches.jsonl"
    cache.write_bytes(b"".join(msgspec.json.encode(Search(flags, 1500, 0.05, seed, SeedCapacity(
        seed, 3.9 + seed / 10, [], fair_capacity_qps=3.3))) + b"\n" for seed in (0, 1)))
    done = load_cache(cache, protocol)
    assert all(_key(job) in done for job in jobs)
    doc = report(table, protocol, tmp_path, done)
    (row,) = [r for g in doc.groups if g.name == "poisson" for r in g.rows]
    assert (row.label, row.mean_qps, row.min_qps, row.max_qps) == ("2A @tp4", 3.95, 3.9, 4.0)
    assert "--start-qps" not in row.command
