"""The capacity table's protocol (bench/ruler/capacity_table.py) on a short ruler: every baseline
setting swept on seed 0, the best of each measured on every seed with and without a drop
rule, the best baseline chosen among the tuned rows, ratios against it.

Covers: bench/ruler/capacity_table.py.
"""
from __future__ import annotations

import pytest

from bench.loadgen.workloads import workload
from bench.ruler.capacity_table import SWEEPS, UPSTREAM, capacity_table
from bench.ruler.ruler import RulerConfig


@pytest.mark.slow
def test_the_table_tunes_the_baselines_and_compares_every_row_with_the_best():
    # Prompts and outputs a quarter as long: every search of the table in seconds.
    config = RulerConfig(workload=workload("poisson", length_scale=4.0), measured=60,
                         seeds=(0, 1), tolerance=0.1)
    [table] = capacity_table([config], workers=2)
    rows = {r.label: r for r in table.rows}
    baselines = {f"{layout} ({kind})" for layout in SWEEPS
                 for kind in ("upstream", "tuned", "tuned, drops")}
    assert set(rows) == baselines | {"2L1H", "1L2H", "2P1D", "1P2D"}
    assert set(SWEEPS) == {"3xsarathi", "3xvllm-v0", "3xvllm-v1", "3xsglang"}
    for layout, sizes in SWEEPS.items():
        assert set(table.sweep[layout]) == set(sizes)
        tuned, dropping = rows[f"{layout} (tuned)"], rows[f"{layout} (tuned, drops)"]
        assert table.sweep[layout][tuned.chunk_size] == max(table.sweep[layout].values())
        assert dropping.chunk_size == tuned.chunk_size and dropping.drop_expired
        assert rows[f"{layout} (upstream)"].chunk_size == UPSTREAM[layout]
    for row in table.rows:
        expected = [0] if "upstream" in row.label else [0, 1]
        assert [s.seed for s in row.seeds] == expected
        assert row.min_qps <= row.mean_qps <= row.max_qps
    best = max((r for r in table.rows if "tuned" in r.label), key=lambda r: r.mean_qps)
    assert table.best_baseline == best.label and best.ratio_to_best_baseline == 1.0
    assert rows["2L1H"].ratio_to_best_baseline == pytest.approx(
        rows["2L1H"].mean_qps / best.mean_qps, abs=1e-3)
    assert 0 < table.ceiling_qps <= table.ceiling_90_qps


def test_a_settings_table_names_its_baselines_or_is_refused_before_any_search(tmp_path, capsys):
    """`fairness --settings` with only Ascendra layouts has no best baseline to divide by:
    a clear error at once, not a traceback after an hour of searches."""
    from bench.ruler.capacity_table import parse_settings
    from bench.studies.fairness import main as fairness
    assert [s.layout for s in parse_settings(["3A", "3xsglang@4096+drops"])] == ["3A", "3xsglang"]
    with pytest.raises(ValueError, match="name no baseline"):
        parse_settings(["3A", "1L2H"])
    with pytest.raises(SystemExit) as exit_:
        fairness(["--out", str(tmp_path / "out"), "--settings", "3A,1L2H"])
    assert exit_.value.code == 2 and "--settings" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_baseline_setting_may_route_its_own_way_and_the_simulation_follows_it():
    """`3xsglang@4096+drops/round_robin`: that baseline with round-robin routing while the
    table's other rows keep the table's routing; a row read back from a table's JSON (the
    Pareto phase) keeps it too."""
    from bench.ruler.capacity_table import parse_settings
    from bench.ruler.ruler import sim_config
    from bench.studies.fairness import _subject
    from policies.routing import Routing
    config = RulerConfig(workload=workload("poisson"))
    own, plain = parse_settings(["3xsglang@4096+drops/round_robin", "3xsglang@4096+drops"])
    assert own.label == "3xsglang@4096 drops round_robin" and own.routing is Routing.ROUND_ROBIN
    assert sim_config(own, config).controller.routing is Routing.ROUND_ROBIN
    assert sim_config(plain, config).controller.routing is config.controller.routing
    assert config.controller.routing is not Routing.ROUND_ROBIN
    row = {"label": own.label, "layout": "3xsglang", "chunk_size": 4096, "drop_expired": True,
           "routing": "round_robin"}
    assert _subject(row) == own
    with pytest.raises(ValueError, match="not one of"):
        parse_settings(["3xsglang@4096/rr"])
    with pytest.raises(ValueError, match="only a baseline"):
        parse_settings(["3A/round_robin", "3xsglang@4096"])


def test_a_pareto_row_says_on_how_many_seeds_a_class_loses_and_by_how_much():
    """A class is flagged worse on its mean over seeds; the row also says on how many of
    the seeds (the same requests for every row) it was under the best baseline, so a loss
    on one seed of three reads differently from a loss on all of them, and the paired
    margin with its standard error, so a tie reads as one."""
    from bench.studies.fairness import _table

    def runs(long_class):            # (goodput, token goodput, classes) per seed
        return [(90.0, 88.0, {"short": 99.0, "long": pct}) for pct in long_class]

    table = {"workload": "poisson", "best_baseline": "base",
             "rows": [{"label": "base", "mean_qps": 9.0}]}
    by_key = {("poisson", "base"): runs([80.0, 80.0, 80.0]),
              ("poisson", "often"): runs([70.0, 75.0, 79.0]),
              ("poisson", "once"): runs([70.0, 81.0, 82.0]),
              ("poisson", "never"): runs([80.0, 81.0, 80.0])}
    rows = {r.label: r for r in _table(table, RulerConfig(), by_key).rows}
    assert rows["often"].worse_than_best_baseline == ["long"]
    assert rows["often"].worse_on_seeds == {"long": 3}
    assert rows["once"].worse_on_seeds == {"long": 1}
    assert rows["never"].worse_than_best_baseline == [] and rows["never"].worse_on_seeds == {}
    assert rows["base"].worse_than_best_baseline == [] and rows["base"].margin == {}
    # paired differences from the best baseline: -10, +1, +2 -> mean -2.33, SE 6.69 / sqrt 3
    assert rows["once"].margin == {"short": 0.0, "long": -2.33}
    assert rows["once"].margin_se == {"short": 0.0, "long": 3.84}
