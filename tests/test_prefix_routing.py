"""Prefix-aware decisions (issue #17): the routing rule and the global queue's binding and
rescue weigh what each instance holds against its load; the controller's index of what
each instance holds; what a request found cached reaches its Settle, the metrics and the
API's usage.

Covers: daemon/core/prefix_index.py, policies/routing.py.
"""
from __future__ import annotations

from collections import OrderedDict

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.response_streamer import usage_counts
from daemon.core.controller_config import ControllerConfig, SloConfig
from daemon.core.controller_core import ControllerCore
from daemon.core.events import Arrived, FromInstance, Send, Settle, StartAccepting
from daemon.metrics import Metrics
from daemon.core import prefix_index
from daemon.core.prefix_index import PrefixIndex
from daemon.core.request_state import Outcome
from ipc.messages import (
    CachedPrompt, FinishReason, Heartbeat, Ready, Role, StepOutputs, StepTokens, TokenOutput,
)
from ipc.params import SamplingParams
from policies.global_queue import Lane, Shed, Waiting, plan
from policies.routing import PREFIX_LOAD_MARGIN, Routing, prefix_aware
from policies.ticket_pick import ticket_pick
from tests.examples import examples

BS = 4


# ---- the pure rules ---------------------------------------------------------------------------
def test_prefix_aware_prefers_the_instance_holding_more_of_the_prompt_while_load_allows():
    # (instance, in flight, cached prompt tokens)
    assert prefix_aware([(0, 3, 0), (1, 3 + PREFIX_LOAD_MARGIN, 64), (2, 5, 32)]) == 1
    assert prefix_aware([(0, 3, 0), (1, 4 + PREFIX_LOAD_MARGIN, 64), (2, 5, 32)]) == 2
    assert prefix_aware([(0, 40, 0), (1, 60, 64)]) == 1    # within half again the least load
    assert prefix_aware([(0, 40, 0), (1, 61, 64)]) == 0
    assert prefix_aware([(0, 2, 0), (1, 1, 0), (2, 5, 0)]) == 1  # nothing cached: least loaded
    assert prefix_aware([]) is None


def test_binding_keeps_a_request_where_its_prefix_is_cached_while_it_is_in_time_there():
    def cheap_on_1(deadline: float) -> Waiting:
        return Waiting("a", 0.0, deadline, cost=0.2, hp_cost=1.0,
                       cost_on=((0, 1.0), (1, 0.2), (2, 1.0)))
    # LP 1 is busier but holds its prefix: it takes it (even past the bound) ...
    out = plan([cheap_on_1(100.0)], [Lane(0, 0.0), Lane(1, 0.5)], [], now=0.0, bound=0.4)
    assert [(w.key, lane) for w, lane in out.to_lp] == [("a", 1)]
    # ... even when LP 0 would finish it first (1.0 against 0.9 + 0.2): computing the
    # prefix again there would cost the pool time, and split the conversation's history
    out = plan([cheap_on_1(100.0)], [Lane(0, 0.0), Lane(1, 0.9)], [], now=0.0, bound=0.4)
    assert [(w.key, lane) for w, lane in out.to_lp] == [("a", 1)]
    # ... but not when it would finish it late there and LP 0 in time
    out = plan([cheap_on_1(1.05)], [Lane(0, 0.0), Lane(1, 0.9)], [], now=0.0, bound=0.4)
    assert [(w.key, lane) for w, lane in out.to_lp] == [("a", 0)]
    # late everywhere: the one that would finish it first
    out = plan([cheap_on_1(0.5)], [Lane(0, 0.0), Lane(1, 0.7)], [], now=0.0, bound=0.4,
               shed=Shed.KEEP)
    assert [(w.key, lane) for w, lane in out.to_lp] == [("a", 1)]   # 0.9 against 1.0
    # no LP under the bound: nothing binds, whatever is cached
    out = plan([cheap_on_1(100.0)], [Lane(0, 0.5), Lane(1, 0.5)], [], now=0.0, bound=0.4)
    assert not out.to_lp


def test_a_conversation_an_hp_holds_may_bind_there_but_no_other_request_does():
    held_on_hp = Waiting("a", 0.0, 100.0, cost=1.0, hp_cost=0.2,
                         cost_on=((0, 1.0), (1, 1.0), (2, 0.2)))
    out = plan([held_on_hp], [Lane(0, 0.0), Lane(1, 0.0)], [Lane(2, 0.3)], now=0.0, bound=2.0)
    assert [(w.key, lane) for w, lane in out.to_lp] == [("a", 2)]  # 0.3 + 0.2 < 0 + 1.0
    # ... unless the HP is so far behind that an LP finishes it first: an HP is a place
    # for rescues, not a cache holder to keep work at
    out = plan([held_on_hp], [Lane(0, 0.0), Lane(1, 0.0)], [Lane(2, 0.9)], now=0.0, bound=2.0)
    assert [(w.key, lane) for w, lane in out.to_lp] == [("a", 0)]
    # a request cached on an LP (or nowhere) never binds to an idle HP
    held_on_lp = Waiting("b", 0.0, 100.0, cost=0.2, hp_cost=1.0,
                         cost_on=((0, 0.2), (1, 1.0), (2, 1.0)))
    plain = Waiting("c", 0.0, 100.0, cost=1.0, hp_cost=0.5)
    out = plan([held_on_lp, plain], [Lane(0, 0.0), Lane(1, 0.0)], [Lane(2, 0.0)], now=0.0,
               bound=2.0)
    assert sorted((w.key, lane) for w, lane in out.to_lp) == [("b", 0), ("c", 1)]


def test_an_hp_ticket_takes_what_costs_it_least_over_an_lp_else_the_head():
    head = Waiting("head", 0.0, 10.0, cost=1.0, hp_cost=1.0)
    lp_history = Waiting("lp", 0.0, 11.0, cost=0.3, hp_cost=1.0, cost_on=((0, 0.3), (2, 1.0)))
    hp_history = Waiting("hp", 0.0, 12.0, cost=1.0, hp_cost=0.3, cost_on=((0, 1.0), (2, 0.3)))
    assert ticket_pick([head, lp_history, hp_history], hp_id=2) == 2
    assert ticket_pick([lp_history, head], hp_id=2) == 1   # not the one an LP holds
    assert ticket_pick([head, Waiting("x", 0.0, 11.0, 5.0, 1.0)], hp_id=2) == 0
    assert ticket_pick([head, lp_history, hp_history], hp_id=2, lookahead=2) == 0


def test_rescue_picks_the_hp_that_finishes_first_counting_its_cached_prefix():
    late = Waiting("a", 0.0, 1.0, cost=5.0, hp_cost=0.3, cost_on=((0, 5.0), (2, 0.9), (3, 0.3)))
    out = plan([late], [Lane(0, 10.0)], [Lane(2, 0.0), Lane(3, 0.5)], now=0.0, bound=1.0)
    assert [(w.key, hp) for w, hp in out.to_hp] == [("a", 3)]


# ---- the controller's index ------------------------------------------------------------------
def ready(instance_id: int, role: Role = Role.PEER, caching: bool = True,
          num_kv_blocks: int = 100) -> Ready:
    return Ready(instance_id=instance_id, role=role, mode="sarathi", executor="sim", pid=1,
                 num_kv_blocks=num_kv_blocks, block_size=BS, max_model_len=4096,
                 prefix_caching=caching)


def test_the_index_answers_what_each_instance_would_find():
    index = PrefixIndex()
    index.ready(ready(0))
    index.ready(ready(1, num_kv_blocks=2))
    index.ready(ready(2, caching=False))
    prompt = list(range(13))                      # 3 full blocks and a token
    names = index.names(prompt)
    index.record(0, names)
    index.record(1, names)                       # holds only the last 2 of them
    index.record(2, names)                       # caches nothing: never asked
    assert index.cached_tokens(names, len(prompt)) == {0: 12}
    assert index.cached_tokens(names[:2], 12) == {0: 8}  # never the last token's block...
    assert index.cached_tokens(index.names(list(range(12))), 12) == {0: 8}  # ... of the prompt
    index.ready(ready(0))                        # restarted: holds nothing
    assert index.cached_tokens(names, len(prompt)) == {}


def _lru_reference(capacity: int, calls: list[list[bytes]]) -> list[bytes]:
    """What a move-to-end LRU holds after `calls`, least recent first."""
    held: OrderedDict[bytes, None] = OrderedDict()
    for names in calls:
        for name in names:
            held[name] = None
            held.move_to_end(name)
        while len(held) > capacity:
            held.popitem(last=False)
    return list(held)


@settings(max_examples=examples(200), deadline=None)
@given(capacity=st.integers(1, 12),
       calls=st.lists(st.lists(st.integers(0, 20), unique=True, max_size=8), max_size=60),
       compact_slack=st.sampled_from([prefix_index.COMPACT_SLACK, 0]))
def test_the_index_forgets_the_least_recently_recorded_names_first(capacity, calls,
                                                                     compact_slack):
    """However names recur across calls (a prompt sent twice, a finished request's
    output), the index holds what a move-to-end LRU of its instance's KV blocks holds,
    and its answers follow -- compacted often or not."""
    default, prefix_index.COMPACT_SLACK = prefix_index.COMPACT_SLACK, compact_slack
    try:
        _record_and_compare(capacity, calls)
    finally:
        prefix_index.COMPACT_SLACK = default


def _record_and_compare(capacity: int, calls: list[list[int]]) -> None:
    index = PrefixIndex()
    index.ready(ready(0, num_kv_blocks=capacity))
    calls = [[bytes([n]) for n in names] for names in calls]
    for done, names in enumerate(calls, 1):
        index.record(0, names)
        expected = _lru_reference(capacity, calls[:done])
        assert [name for name in map(bytes, ([n] for n in range(21)))
                if index.cached_tokens([name], 2 * BS)] == sorted(expected)


# ---- through the controller core ----------------------------------------------------------------
def peers(routing: Routing = Routing.PREFIX_AWARE) -> ControllerCore:
    core = ControllerCore({i: Role.PEER for i in range(3)}, ControllerConfig(routing=routing),
                          SloConfig(ttft_slo=1.0, tbt_slo=0.1))
    for i in range(3):
        core.handle(FromInstance(0.0, ready(i)))
    core.handle(StartAccepting(0.0))
    return core


def arrive(core, request_id: str, prompt: list[int], now: float = 1.0):
    return core.handle(Arrived(now, request_id, prompt, SamplingParams(max_tokens=2)))


def target_of(actions) -> int:
    [send] = [a for a in actions if isinstance(a, Send)]
    return send.instance_id


def test_a_request_follows_its_prefix_and_its_settle_says_what_was_cached():
    core = peers()
    system = list(range(100, 140))
    first = target_of(arrive(core, "a", system + [1, 2]))
    assert target_of(arrive(core, "x", [7] * 30)) != first  # unrelated: the least loaded
    assert target_of(arrive(core, "b", system + [3, 4, 5])) == first
    core.handle(FromInstance(2.0, StepOutputs(
        instance_id=first, step=1, time=2.0, step_seconds=0.01,
        tokens=StepTokens.of([TokenOutput("b", 9)]), cached=[CachedPrompt("b", 40)])))
    actions = core.handle(FromInstance(2.1, StepOutputs(
        instance_id=first, step=2, time=2.1, step_seconds=0.01,
        tokens=StepTokens.of([TokenOutput("b", 9, FinishReason.LENGTH)]))))
    [settle] = [a for a in actions if isinstance(a, Settle)]
    assert (settle.outcome, settle.prompt_tokens, settle.cached_tokens) == (
        Outcome.COMPLETED, 43, 40)


def test_round_robin_ignores_what_is_cached():
    core = peers(Routing.ROUND_ROBIN)
    system = list(range(100, 140))
    targets = [target_of(arrive(core, f"r{i}", system + [i])) for i in range(3)]
    assert sorted(targets) == [0, 1, 2]


def test_a_completed_conversation_turn_is_known_with_its_output():
    core = peers()
    first = target_of(arrive(core, "t1", list(range(50, 58))))       # 2 blocks
    replies = [60, 61, 62, 63, 64]
    core.handle(FromInstance(2.0, StepOutputs(
        instance_id=first, step=1, time=2.0, step_seconds=0.01,
        tokens=StepTokens.of([TokenOutput("t1", t) for t in replies[:-1]]
                             + [TokenOutput("t1", replies[-1], FinishReason.LENGTH)]))))
    # the instance computed the prompt and every reply token but the last: 3 full blocks
    names = core.prefix_index.names(list(range(50, 58)) + replies + [70, 71])
    assert core.prefix_index.cached_tokens(names, 15) == {first: 12}


# ---- metrics and usage ----------------------------------------------------------------------
def test_metrics_count_cached_prompt_tokens_and_instance_hit_rates():
    metrics = Metrics({0: Role.PEER})
    metrics.observe(Settle("a", Outcome.COMPLETED, instance=0, prompt_tokens=100,
                           cached_tokens=64))
    metrics.observe(Settle("b", Outcome.CANCELLED, instance=0, prompt_tokens=50))
    metrics.heartbeat(Heartbeat(instance_id=0, time=1.0, prefix_queried_blocks=10,
                                prefix_hit_blocks=4, prefix_queried_tokens=170,
                                prefix_hit_tokens=64))
    text = metrics.render().decode()
    assert "ascendra_prompt_tokens_total 100.0" in text
    assert "ascendra_prompt_tokens_cached_total 64.0" in text
    assert 'ascendra_instance_prefix_cache_hit_rate{instance="0",unit="blocks"} 0.4' in text


class _Handle(msgspec.Struct):
    num_cached_tokens: int


class _Prompt(msgspec.Struct):
    token_ids: list[int]


class _Choice(msgspec.Struct):
    prompt: _Prompt


class _Running(msgspec.Struct):
    handle: _Handle
    count: int


def test_usage_counts_each_prompts_cached_tokens_once():
    one, two = _Prompt([1] * 40), _Prompt([2] * 10)
    choices = [_Choice(one), _Choice(one), _Choice(two)]
    running = [_Running(_Handle(32), 3), _Running(_Handle(36), 3), _Running(_Handle(0), 2)]
    assert usage_counts(running, choices) == (50, 8, 32)


# ---- end to end -------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_daemon_reports_cached_prompt_tokens_in_usage_and_metrics(daemon_factory):
    daemon = daemon_factory("--layout", "2xsarathi", "--block-size", "16")
    system = [(7 * i) % 200 + 3 for i in range(200)]
    usages = []
    for question in ([11, 12, 13], [21, 22]):
        status, _, raw = daemon.request("POST", "/v1/completions", {
            "prompt": system + question, "max_tokens": 3, "ignore_eos": True})
        assert status == 200, raw
        usages.append(msgspec.json.decode(raw)["usage"])
    assert usages[0]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert usages[1]["prompt_tokens_details"] == {"cached_tokens": 192}  # 12 full blocks
    _, _, metrics = daemon.request("GET", "/metrics")
    assert b"ascendra_prompt_tokens_cached_total 192.0" in metrics
