"""The multiplexed instance core on sim executors: one KV pool counted in head-wise units
that every model's requests draw on (and give back), each step's token budget split by
popularity and TBT target and water-filled by demand, requests routed to their model's
part (an unknown model refused by name), one StepOutputs and one Heartbeat a step with
each model's blocks in use.

Covers: engines/mux_core.py, engines/kv_pool.py, engines/kv_cache.py, policies/mux_share.py, engines/executors/mux_executor.py, engines/mux_build.py.
"""
from __future__ import annotations

import pytest

from engines.executors.latency import make_latency
from engines.executors.mux_executor import MuxExecutor
from engines.executors.sim_executor import SimExecutor
from engines.kv_cache import BlockManager
from engines.kv_pool import KvPool
from engines.mux_build import build_mux_core, units_per_block
from engines.perf.model_shape import ModelShape
from engines.request import Request
from engines.scheduler_config import SchedulerConfig
from ipc.messages import Heartbeat, Ping, RequestError, Role, StepOutputs, Submit
from ipc.params import SamplingParams
from policies.mux_share import split_budget

BIG = ModelShape(layers=4, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128,
                 vocab=100)
SMALL = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128,
                   vocab=100)


def _core(num_units=8 * 40, chunk_size=64, **config):
    shapes = {"big": BIG, "small": SMALL}
    costs = units_per_block(shapes)
    executors = {n: SimExecutor(make_latency("constant:0.01"),
                                num_kv_blocks=num_units // costs[n], block_size=4)
                 for n in shapes}
    scheduler = SchedulerConfig(mode="sarathi", chunk_size=chunk_size, **config)
    return build_mux_core(3, Role.PEER, executors, shapes, scheduler, num_units), \
        MuxExecutor(executors)


def _submit(request_id, model, prompt_len=10, max_tokens=4, tbt_slo=None):
    return Submit(request_id=request_id, prompt_token_ids=[1] * prompt_len,
                  sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                  arrival_time=0.0, model=model, tbt_slo=tbt_slo)


def _run(core, executor, now=0.0):
    messages = []
    while core.has_work:
        batch, outputs = core.begin_step(now)
        messages += outputs
        if batch:
            now += executor.latency(batch)
            messages += core.finish_step(batch, executor.tokens(batch), 0.01, now)
    return messages


def test_blocks_of_both_models_draw_on_one_pool():
    pool = KvPool(40)
    big = BlockManager(5, 4, pool=pool, model="big", block_units=8)
    small = BlockManager(10, 4, pool=pool, model="small", block_units=4)
    a, b = Request("a", [1] * 12, SamplingParams()), Request("b", [1] * 20, SamplingParams())
    assert big.allocate(a, 12)               # 3 blocks of 8 units
    assert small.num_free_blocks == 4        # 16 units left: 4 of its blocks
    assert not small.allocate(b, 20)         # 5 would not fit
    assert small.allocate(b, 16)
    assert pool.used_by == {"big": 24, "small": 16} and big.num_free_blocks == 0
    big.free(a)
    assert pool.free_units == 24 and small.num_free_blocks == 6


def test_the_budget_splits_by_weight_and_leftovers_go_to_who_wants_more():
    assert split_budget(100, [4.0, 1.0], [1000, 1000]) == [80, 20]
    assert split_budget(100, [4.0, 1.0], [10, 1000]) == [10, 90]  # water-filled
    assert split_budget(100, [1.0, 1.0], [0, 1000]) == [0, 100]   # alone: the whole budget
    assert split_budget(100, [1.0, 9.0], [1000, 1000])[0] >= 1


def test_popularity_and_tbt_target_set_the_shares():
    core, _ = _core(chunk_size=100)
    for i in range(8):
        core.handle(_submit(f"b{i}", "big", prompt_len=120), 0.0)
    core.handle(_submit("s0", "small", prompt_len=120), 0.0)
    shares = core.budgets(0.0)
    assert shares["big"] > 1.5 * shares["small"] > 0  # sqrt(9) : sqrt(2)
    assert sum(shares.values()) <= 100
    core.handle(_submit("s1", "small", prompt_len=120, tbt_slo=0.01), 0.0)
    assert core.budgets(0.0)["small"] > shares["small"]  # a tighter TBT target: more


def test_every_request_is_answered_once_and_the_pool_empties():
    core, executor = _core(num_units=8 * 12, chunk_size=16)  # tight: preemption
    for i in range(6):
        for model in ("big", "small"):
            core.handle(_submit(f"{model}{i}", model, prompt_len=9 + i, max_tokens=6), 0.0)
    messages = _run(core, executor)
    steps = [m for m in messages if isinstance(m, StepOutputs)]
    finished = [rid for s in steps for i, rid in enumerate(s.tokens.request_ids)
                if i in s.tokens.finished]
    assert sorted(finished) == sorted(f"{m}{i}" for i in range(6) for m in ("big", "small"))
    assert [s.step for s in steps] == list(range(1, len(steps) + 1))  # one message a step
    assert core.pool.used_units == 0
    assert sum(p.scheduler.num_preemptions for p in core.parts.values()) > 0


def test_unknown_model_is_refused_by_name_and_the_heartbeat_shows_each_models_blocks():
    core, executor = _core()
    [error] = core.handle(_submit("x", "nope"), 0.0)
    assert isinstance(error, RequestError) and "'nope'" in error.message
    core.handle(_submit("b", "big", prompt_len=9), 0.0)
    core.handle(_submit("s", "", prompt_len=9), 0.0)  # "": the first model
    assert core.part_of("s") is core.parts["big"]
    batch, _ = core.begin_step(0.0)
    core.finish_step(batch, executor.tokens(batch), 0.01, 0.01)
    [beat] = core.handle(Ping(ping_id=1), 0.01)
    assert isinstance(beat, Heartbeat) and beat.kv_blocks_by_model == {"big": 6, "small": 0}
    ready = core.ready(pid=1, executor_kind="sim")
    assert ready.models == ["big", "small"]


def test_p_d_roles_are_not_multiplexed():
    with pytest.raises(ValueError, match="prefill"):
        shapes = {"big": BIG}
        build_mux_core(0, Role.PREFILL, {"big": SimExecutor(make_latency("zero"))}, shapes,
                       SchedulerConfig(), 100)


def test_an_unpopular_model_keeps_a_floor_of_the_budget():
    budgets = split_budget(1000, [1000.0, 1e-9], [5000, 5000])
    assert budgets[1] >= 40 and sum(budgets) <= 1000


def test_popularity_decays_from_the_first_arrival_not_from_time_zero():
    core, _ = _core(chunk_size=100)
    core.handle(_submit("b0", "big", prompt_len=120), 10_000.0)   # a daemon's monotonic clock
    core.handle(_submit("s0", "small", prompt_len=120), 10_000.0)
    shares = core.budgets(10_000.0)
    assert shares["big"] == shares["small"] == 50


def test_routing_keeps_a_models_requests_together_while_loads_allow():
    from policies.mux_share import model_affine_loads
    held = {0: {"A": 3}, 1: {"B": 1}, 2: {}}
    loads = model_affine_loads({0: 3, 1: 1, 2: 0}, held, "B", penalty=8)
    assert loads == {0: 11, 1: 1, 2: 0}  # A's instance would newly mix: counted heavier
    assert model_affine_loads({0: 3, 1: 1}, held, "A", penalty=8) == {0: 3, 1: 9}
