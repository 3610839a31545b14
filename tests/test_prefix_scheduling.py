"""The scheduler with prefix caching, on the model-free executor (tests/fakes.py checks that
every chunk's cached context, read back through its block table, is its own tokens):
prefills skip the cached prefix, preemption recomputes from what is still cached, and
the tokens are those of a run without caching.

Covers: engines/scheduler.py, engines/kv_cache.py.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.offline import Offline
from engines.scheduler import SchedulerConfig
from ipc.params import SamplingParams
from tests.fakes import FakeExecutor, FakeInstance, expected_output
from tests.examples import examples

SYSTEM = list(range(2, 42))   # 40 tokens: 10 full blocks of 4


def offline_for(mode: str = "sarathi", caching: bool = True, num_kv_blocks: int = 64,
                chunk_size: int = 16) -> Offline:
    return Offline(FakeExecutor(num_kv_blocks=num_kv_blocks),
                   SchedulerConfig(mode=mode, chunk_size=chunk_size, prefix_caching=caching))


def prefill_tokens(offline: Offline) -> int:
    return sum(c.num_tokens for b in offline.executor.batches for c in b.chunks if not c.is_decode)


@pytest.mark.parametrize("mode", ["sarathi", "vllm", "lp", "hp"])
def test_a_later_request_skips_the_shared_prefix(mode):
    offline = offline_for(mode)
    first = offline.generate([SYSTEM + [5, 6]], SamplingParams(max_tokens=4))[0]
    second = offline.add_request(SYSTEM + [7, 8, 9], SamplingParams(max_tokens=4))
    assert second.num_computed_tokens == 40, "waiting, it is priced by what it will find"
    before = prefill_tokens(offline)
    while offline.core.has_work:
        offline.step()
    assert prefill_tokens(offline) - before == 3          # only its own three tokens
    assert second.num_cached_tokens == 40
    assert second.output_token_ids == expected_output(SYSTEM + [7, 8, 9], 4)
    assert first.token_ids == expected_output(SYSTEM + [5, 6], 4)
    assert offline.core.kv.num_free_blocks == offline.core.kv.num_blocks
    stats = offline.core.kv.stats
    assert stats.hit_tokens == 40 and stats.queried_tokens == 42 + 43


def test_without_caching_every_prompt_is_computed():
    offline = offline_for(caching=False)
    offline.generate([SYSTEM + [5]], SamplingParams(max_tokens=2))
    offline.generate([SYSTEM + [6]], SamplingParams(max_tokens=2))
    assert prefill_tokens(offline) == 82 and offline.core.kv.stats.hit_tokens == 0


def test_concurrent_requests_with_one_prefix_are_all_right():
    offline = offline_for(num_kv_blocks=80)
    prompts = [SYSTEM + [10 + i] * (i + 1) for i in range(6)]
    results = offline.generate(prompts, SamplingParams(max_tokens=6))
    assert [r.token_ids for r in results] == [expected_output(p, 6) for p in prompts]
    assert offline.core.kv.num_free_blocks == offline.core.kv.num_blocks


def test_a_preempted_request_finds_its_own_blocks_again():
    offline = offline_for(num_kv_blocks=30)
    prompts = [[20 + i] * 40 + [i] for i in range(4)]   # 11 blocks each with output: 30 is short
    results = offline.generate(prompts, SamplingParams(max_tokens=8))
    assert offline.core.scheduler.num_preemptions > 0
    assert [r.token_ids for r in results] == [expected_output(p, 8) for p in prompts]
    assert offline.core.kv.stats.hit_tokens > 0, "a recompute found blocks of its own"
    assert offline.core.kv.num_free_blocks == offline.core.kv.num_blocks


prefixes = st.lists(st.integers(2, 6), min_size=0, max_size=24)


@settings(max_examples=examples(60), deadline=None)
@given(shared=st.lists(prefixes, min_size=1, max_size=3),
       prompts=st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(2, 9), min_size=1,
                                                                max_size=12)),
                        min_size=1, max_size=8),
       num_kv_blocks=st.integers(12, 40), mode=st.sampled_from(["sarathi", "vllm", "lp"]),
       max_tokens=st.integers(1, 10))
def test_caching_changes_no_token(shared, prompts, num_kv_blocks, mode, max_tokens):
    """Prompts built from a few shared prefixes, in a KV cache small enough to evict and
    preempt: the same tokens with and without prefix caching, and no block leaks."""
    texts = [shared[k % len(shared)] + tail for k, tail in prompts]
    outputs = []
    for caching in (False, True):
        offline = offline_for(mode, caching, num_kv_blocks=num_kv_blocks, chunk_size=16)
        results = offline.generate(texts, SamplingParams(max_tokens=max_tokens))
        outputs.append([r.token_ids for r in results])
        assert offline.core.kv.num_free_blocks == offline.core.kv.num_blocks, "KV blocks leaked"
        offline.core.kv.check()
    assert outputs[0] == outputs[1] == [expected_output(t, max_tokens) for t in texts]


def test_an_instance_reports_a_first_admissions_cached_prompt_and_its_hit_rates():
    from ipc.messages import CachedPrompt, Role, StepOutputs, Submit

    def submit(request_id: str, prompt: list[int]) -> Submit:
        return Submit(request_id=request_id, prompt_token_ids=prompt, arrival_time=0.0,
                      sampling=SamplingParams(max_tokens=2))

    driver = FakeInstance(3, Role.PEER, SchedulerConfig(mode="sarathi", chunk_size=16),
                          FakeExecutor(num_kv_blocks=64))
    instance = driver.core
    assert instance.ready(pid=1, executor_kind="sim").prefix_caching

    def run():
        cached = []
        while instance.has_work:
            for message in driver.step():
                if isinstance(message, StepOutputs):
                    cached += message.cached
        return cached

    instance.handle(submit("a", SYSTEM + [5]), now=0.0)
    assert run() == []                      # nothing cached yet: nothing to say
    instance.handle(submit("b", SYSTEM + [6, 7]), now=1.0)
    assert run() == [CachedPrompt("b", 40)]
    beat = instance.heartbeat(2.0)
    assert (beat.prefix_queried_tokens, beat.prefix_hit_tokens) == (41 + 42, 40)
    assert (beat.prefix_queried_blocks, beat.prefix_hit_blocks) == (10 + 10, 10)
