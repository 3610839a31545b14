"""bench/loadgen/workloads.py: the named workloads are what they say, reproducibly from a seed.

Statistics at n = 20,000: gamma gaps have the CV the name says, the on/off process keeps
its long-run mean rate, SLO classes come in the shares asked for; every workload gives
the same requests for the same seed and others for another.

Covers: bench/loadgen/workloads.py.
"""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from bench.loadgen.arrivals import OnOff, onoff_offsets
from bench.loadgen.workload import TraceRow, build_workload
from bench.loadgen.workload_flags import add_workload_flags, workload_spec
from bench.loadgen.workloads import (
    DEFAULT_SLO_MIX,
    SLO_CLASSES,
    WORKLOADS,
    SloShare,
    build_requests,
    parse_slo_mix,
    workload,
)

ROWS = [TraceRow(p, 10 + p % 50) for p in range(1, 3001, 3)]
N = 20_000


def gaps(requests) -> np.ndarray:
    return np.diff([r.arrival for r in requests])


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_workload_is_deterministic_per_seed(name, tmp_path):
    spec = workload(name)
    rows = ROWS
    if name == "replay":  # a replay needs times; its seed only draws the SLO classes
        rows = [TraceRow(10, 5, arrival=t) for t in np.cumsum(np.full(50, 0.5))]
        spec = workload(name, slo_mix=DEFAULT_SLO_MIX)
    first = build_requests(spec, rate=4.0, num_requests=50, seed=7, rows=rows)
    assert first == build_requests(spec, rate=4.0, num_requests=50, seed=7, rows=rows)
    assert first != build_requests(spec, rate=4.0, num_requests=50, seed=8, rows=rows)
    # 50 requests of the run (a multi-turn run is primed with more first: `warmup`)
    assert sum(not r.warmup for r in first) == 50 and first[0].arrival == 0.0
    assert [r.index for r in first] == list(range(len(first)))


def test_poisson_is_the_plain_workload_of_before():
    """Same seed, same requests as bench/loadgen/workload.py build_workload: old runs reproduce."""
    assert (build_requests(WORKLOADS["poisson"], rate=5.0, num_requests=300, seed=3)
            == build_workload("sharegpt", rate=5.0, num_requests=300, seed=3))


@pytest.mark.parametrize("name, cv", [("poisson", 1.0), ("bursty-cv2", 2.0), ("bursty-cv4", 4.0)])
def test_gamma_gaps_have_the_named_cv_and_the_rate(name, cv):
    g = gaps(build_requests(WORKLOADS[name], rate=8.0, num_requests=N, seed=0, rows=ROWS))
    assert g.std() / g.mean() == pytest.approx(cv, rel=0.1)
    assert 1 / g.mean() == pytest.approx(8.0, rel=0.05)


def test_onoff_keeps_the_long_run_rate_and_is_bursty():
    onoff = OnOff()
    assert (onoff.on_mean_s, onoff.off_mean_s, onoff.on_factor) == (10.0, 30.0, 3.0)
    assert onoff.off_factor == pytest.approx(1 / 3)
    assert onoff.on_share * onoff.on_factor + (1 - onoff.on_share) * onoff.off_factor == 1.0
    # rate 0.25/s: 20,000 arrivals span ~80,000 s, ~2,000 ON/OFF cycles
    times = [r.arrival for r in build_requests(WORKLOADS["onoff"], rate=0.25, num_requests=N,
                                               seed=0, rows=ROWS)]
    assert (len(times) - 1) / times[-1] == pytest.approx(0.25, rel=0.08)
    counts = np.histogram(times, bins=np.arange(0, times[-1], 10.0))[0]
    assert counts.var() / counts.mean() > 3      # far burstier than Poisson (1)


def test_onoff_within_a_duration():
    times = onoff_offsets(20.0, seed=1, duration=400.0)
    assert times[0] == 0.0 and times[-1] < 400.0 and np.all(np.diff(times) >= 0)
    assert len(times) == pytest.approx(8000, rel=0.35)
    with pytest.raises(ValueError, match="on_factor must be 1..4"):
        onoff_offsets(1.0, OnOff(on_factor=5.0), n=10)
    with pytest.raises(ValueError, match="finite rate"):
        build_requests(WORKLOADS["onoff"], rate=float("inf"), num_requests=10, rows=ROWS)


def test_mixed_slo_classes_come_in_their_shares_with_their_targets():
    requests = build_requests(WORKLOADS["mixed-slo"], rate=10.0, num_requests=N, seed=0, rows=ROWS)
    names = [r.slo_class for r in requests]
    assert [(s.slo_class, s.share) for s in DEFAULT_SLO_MIX] == [
        ("interactive", 0.3), ("standard", 0.5), ("batch", 0.2)]
    for s in DEFAULT_SLO_MIX:
        assert names.count(s.slo_class) / N == pytest.approx(s.share, abs=0.015)
    assert [(c.name, c.ttft_slo, c.tbt_slo) for c in SLO_CLASSES] == [
        ("interactive", 0.5, 0.1), ("standard", 2.0, 0.15), ("batch", 30.0, 0.5)]
    targets = {c.name: (c.ttft_slo, c.tbt_slo) for c in SLO_CLASSES}
    assert all((r.ttft_slo, r.tbt_slo) == targets[r.slo_class] for r in requests)
    g = gaps(requests)
    assert g.std() / g.mean() == pytest.approx(1.0, rel=0.1)    # Poisson arrivals


def flags(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--trace", default="sharegpt")
    p.add_argument("--burstiness", type=float, default=1.0)
    add_workload_flags(p)
    return p.parse_args(list(argv))


def test_the_flags_make_the_spec():
    spec = workload_spec(flags("--slo-mix", "interactive=0.7,batch=0.3", "--max-prompt-len", "64"))
    assert (spec.name, spec.slo_mix, spec.max_prompt_len) == (
        "poisson", (SloShare("interactive", 0.7), SloShare("batch", 0.3)), 64)
    assert hash(spec) == hash(workload_spec(flags("--slo-mix", "interactive=0.7,batch=0.3",
                                                  "--max-prompt-len", "64")))
    requests = build_requests(spec, rate=5.0, num_requests=2000, seed=0)
    assert {r.slo_class for r in requests} == {"interactive", "batch"}
    assert max(r.prompt_len for r in requests) == 64
    gamma = workload_spec(flags("--burstiness", "0.25"))   # as `vllm bench serve`
    assert (gamma.arrival, gamma.burstiness) == ("gamma", 0.25)
    assert (build_requests(gamma, rate=3.0, num_requests=100, seed=2)
            == build_workload("sharegpt", rate=3.0, burstiness=0.25, num_requests=100, seed=2))
    assert workload_spec(flags("--workload", "onoff")).arrival == "onoff"


@pytest.mark.parametrize("argv, message", [
    (["--workload", "onoff", "--burstiness", "0.5"], "onoff arrivals of its own"),
    (["--slo-mix", "interactive=0.5,vip=0.5"], "'vip=0.5' is not CLASS=SHARE"),
    (["--slo-mix", "interactive=0.5,batch=x"], "the share of batch is 'x'"),
    (["--slo-mix", "interactive=0.5,batch=0.2"], "sum to 1, got interactive=0.5,batch=0.2"),
    (["--workload", "poisson", "--rate-scale", "2"], "rate_scale (--rate-scale) applies"),
    (["--workload", "poisson", "--arrival-column", "t"], "applies to a replayed trace"),
    (["--workload", "poisson", "--max-prompt-len", "0"], "max_prompt_len must be >= 1"),
])
def test_flags_that_cannot_be_honoured_are_refused(argv, message):
    with pytest.raises(ValueError) as error:
        build_requests(workload_spec(flags(*argv)), rate=1.0, num_requests=5)
    assert message in str(error.value)


def test_a_generated_workload_needs_a_rate_and_parse_keeps_the_order():
    with pytest.raises(ValueError, match="needs an arrival rate"):
        build_requests(WORKLOADS["poisson"], num_requests=5)
    assert parse_slo_mix("batch=1") == (SloShare("batch", 1.0),)
    with pytest.raises(ValueError, match="each at most once"):
        build_requests(workload("poisson", slo_mix=parse_slo_mix("batch=0.5,batch=0.5")),
                       rate=1.0, num_requests=5)


def test_long_prompts_are_trimmed_then_fitted_to_the_context():
    rows = [TraceRow(5000, 100), TraceRow(300, 9000), TraceRow(10, 10)]
    spec = workload("poisson", max_prompt_len=1000)
    requests = build_requests(spec, rate=1.0, num_requests=3, seed=0, rows=rows,
                              max_model_len=2048)
    lengths = sorted((r.prompt_len, r.output_len) for r in requests)
    # prompt trimmed to 1000; output kept below the context, the prompt cut to fit
    assert lengths == [(1, 2047), (10, 10), (1000, 100)]


@pytest.mark.slow
def test_a_script_simulates_its_own_requests_in_memory():
    """`bench.sim.box_run.simulate(sim, requests)`: no trace file and no command line."""
    from bench.sim.box_run import simulate
    from tests.simulator_helpers import sim_config
    requests = build_requests(workload("mixed-slo"), rate=4.0, num_requests=40, seed=3,
                              max_model_len=2048)
    result = simulate(sim_config("2L1H", latency="constant:0.02", max_model_len=2048),
                      requests, keep_records=True)
    assert result.num_requests == 40 and result.lost == 0
    assert sorted(r.index for r in result.records) == [w.index for w in requests]
    assert {c.slo_class for c in result.per_class} <= {"interactive", "standard", "batch"}
    assert sum(c.num_requests for c in result.per_class) == 40
