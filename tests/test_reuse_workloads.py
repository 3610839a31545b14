"""Workloads with reuse (bench/loadgen/reuse_workloads.py) and what the simulator makes of them:
the prompts share exactly the prefixes they say, the reuse ratios are the known ones,
and caching shows in the simulated run (step times count only uncached prefill).

Covers: bench/loadgen/reuse_workloads.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from bench.loadgen.reuse_workloads import ideal_reuse
from bench.loadgen.workload import request_prompt
from bench.loadgen.workloads import build_requests, workload
from bench.sim.box_run import simulate
from bench.sim.simulator import SimConfig
from engines.batch import Batch
from engines.executors.latency import make_latency
from engines.request import Request
from engines.scheduler_config import SchedulerConfig
from ipc.params import SamplingParams


def test_every_system_prompt_request_starts_with_the_same_system_prompt():
    requests = build_requests(workload("system-prompt", max_prompt_len=64), rate=2.0,
                              num_requests=40, seed=3, max_model_len=4096)
    prompts = [request_prompt(r, seed=3) for r in requests]
    assert all(len(p) == r.prompt_len for p, r in zip(prompts, requests))
    assert all(p[:1000] == prompts[0][:1000] for p in prompts)
    assert len({tuple(p[1000:]) for p in prompts}) == 40, "each question its own"
    mean_question = np.mean([r.prompt_len - 1000 for r in requests])
    # an unbounded cache finds the system prompt's full blocks after the first request
    assert ideal_reuse(requests, 16) == pytest.approx(
        992 * 39 / sum(r.prompt_len for r in requests))
    assert ideal_reuse(requests, 16) > 992 / (1000 + mean_question) - 0.03


def test_a_conversation_turn_starts_with_the_turn_before_it():
    requests = build_requests(workload("multi-turn"), rate=1.0, num_requests=200, seed=5,
                              max_model_len=8192)
    assert requests[0].arrival == 0.0
    assert [r.arrival for r in requests] == sorted(r.arrival for r in requests)
    last: dict[int, list[int]] = {}
    followed = 0
    for r in requests:
        conversation = r.prompt_parts[0].key[1]
        prompt = request_prompt(r, seed=5)
        if conversation in last:
            assert prompt[:len(last[conversation])] == last[conversation]
            assert len(prompt) > len(last[conversation])
            followed += 1
        last[conversation] = prompt
    assert followed > 100
    assert build_requests(workload("multi-turn"), rate=1.0, num_requests=200, seed=5,
                          max_model_len=8192) == requests


def test_a_multi_turn_run_is_primed_with_the_earlier_turns_of_the_conversations_it_joins():
    requests = build_requests(workload("multi-turn"), rate=2.0, num_requests=300, seed=4,
                              max_model_len=8192)
    priming = [r for r in requests if r.warmup]
    run = requests[len(priming):]
    assert priming and requests[:len(priming)] == priming, "priming comes first"
    assert len(run) == 300 and not any(r.warmup for r in run)
    conversation = {r.index: r.prompt_parts[0].key[1] for r in requests}
    joined = {conversation[r.index] for r in run}
    assert {conversation[r.index] for r in priming} <= joined
    # every turn of a joined conversation before the run is there: its next turn's
    # history is all cached (an unbounded cache finds every earlier piece)
    for r in run:
        earlier = [p for p in requests if conversation[p.index] == conversation[r.index]
                   and p.arrival < r.arrival]
        assert len(earlier) == len(r.prompt_parts) - 1


def test_multi_turn_reuse_approaches_the_known_ratio_over_a_long_run():
    requests = build_requests(workload("multi-turn"), rate=0.5, num_requests=600, seed=0,
                              max_model_len=8192)
    assert ideal_reuse(requests, 16) == pytest.approx((5 - 1) / (5 + 1), abs=0.03)


def test_a_workload_with_reuse_refuses_what_it_cannot_honour():
    with pytest.raises(ValueError, match="not both"):
        build_requests(workload("multi-turn", system_prompt_len=10), rate=1.0, num_requests=5)
    with pytest.raises(ValueError, match="poisson or gamma"):
        build_requests(workload("onoff", turns=3), rate=1.0, num_requests=5)


def test_the_sim_step_time_counts_only_uncached_prefill():
    latency = make_latency("profile:a100-llama3-8b")
    full, cached = Request("a", [3] * 1020, SamplingParams()), Request("b", [3] * 1020,
                                                                        SamplingParams())
    full.block_table = list(range(64))
    cached.block_table, cached.num_computed_tokens = list(range(64)), 992
    whole, rest = Batch(), Batch()
    whole.add(full, 1020)
    rest.add(cached, 28)
    assert latency(rest) < 0.5 * latency(whole)


@pytest.mark.slow
def test_caching_shows_in_a_simulated_multi_turn_run():
    requests = build_requests(workload("multi-turn"), rate=12.0, num_requests=900, seed=0,
                              max_model_len=8192)
    results = {caching: simulate(SimConfig(layout_modes=("sarathi", "sarathi"),
                                           scheduler=SchedulerConfig(prefix_caching=caching)),
                                 requests)
               for caching in (True, False)}
    on, off = results[True], results[False]
    assert on.prompt_cached_pct > 20 and off.prompt_cached_pct == 0
    assert on.ttft_s.mean < off.ttft_s.mean


@pytest.mark.slow
def test_a_multi_turn_runs_figures_count_only_its_own_turns_not_the_priming_ones():
    """`simulate --num-requests 120` on multi-turn reports 120 requests: the earlier turns
    sent to prime the cache are counted apart, and a records file marks them unmeasured."""
    from bench.records.records_file import record_rows
    requests = build_requests(workload("multi-turn"), rate=4.0, num_requests=120, seed=1,
                              max_model_len=8192)
    primed = sum(r.warmup for r in requests)
    result = simulate(SimConfig(layout_modes=("sarathi",)), requests, keep_records=True)
    assert primed > 0
    assert (result.num_requests, result.primed) == (120, primed)
    assert result.completed + result.dropped + result.errored + result.lost == 120
    run = [r for r in result.records if not r.warmup]
    assert result.duration_s == pytest.approx(max(r.end_time for r in run)
                                              - min(r.arrival for r in run))
    rows = record_rows(result.records, 1.0, 0.15)
    assert sum(row.measured for row in rows) == 120 and len(rows) == 120 + primed
