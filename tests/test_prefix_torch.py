"""Prefix caching on the real executor (the tiny model on CPU): greedy generation with
caching is token for token generation without it -- prompts sharing prefixes, a KV pool
small enough that cached blocks are evicted and running requests preempted -- and every
block is free again at the end.

Covers: engines/kv_cache.py, engines/executors/torch_executor.py.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.executors.torch_executor import TorchExecutor
from engines.offline import Offline
from engines.scheduler import SchedulerConfig
from ipc.params import SamplingParams

BLOCK_SIZE = 8


@pytest.fixture(scope="module")
def executors(tiny_models):
    """One executor per KV pool size, reused: each instance core starts a fresh block manager."""
    made: dict[int, TorchExecutor] = {}

    def get(num_kv_blocks: int) -> TorchExecutor:
        if num_kv_blocks not in made:
            made[num_kv_blocks] = TorchExecutor(tiny_models["llama"], block_size=BLOCK_SIZE,
                                                num_kv_blocks=num_kv_blocks, device="cpu")
        return made[num_kv_blocks]
    return get


def generate(executor, prompts, caching: bool, mode: str, max_tokens: int):
    offline = Offline(executor, SchedulerConfig(mode=mode, chunk_size=32, prefix_caching=caching))
    results = offline.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    assert offline.core.kv.num_free_blocks == offline.core.kv.num_blocks, "KV blocks leaked"
    offline.core.kv.check()
    return offline, [r.token_ids for r in results]


def test_shared_prefix_through_eviction_and_preemption(executors):
    system = [(7 * i) % 250 + 3 for i in range(40)]          # 5 full blocks
    prompts = [system + [10 + i, 20 + i, 30 + i] for i in range(5)] + [[99] * 30, system + [5]]
    executor = executors(16)  # 128 tokens: the requests cannot all be held at once
    plain, expected = generate(executor, prompts, False, "sarathi", 12)
    cached, got = generate(executor, prompts, True, "sarathi", 12)
    assert got == expected
    assert cached.core.kv.stats.hit_tokens > 0, "the shared prefix was found"
    assert cached.core.scheduler.num_preemptions > 0 and cached.core.kv.stats.evictions > 0


token = st.integers(3, 250)


@pytest.mark.slow  # a few seconds alone, much more on a busy machine
@settings(max_examples=25, deadline=None)
@given(shared=st.lists(st.lists(token, min_size=4, max_size=40), min_size=1, max_size=2),
       tails=st.lists(st.tuples(st.integers(0, 1), st.lists(token, min_size=1, max_size=10)),
                      min_size=2, max_size=6),
       num_kv_blocks=st.sampled_from([12, 16, 64]), mode=st.sampled_from(["sarathi", "vllm"]),
       max_tokens=st.integers(1, 10))
def test_caching_equals_no_caching_token_for_token(executors, shared, tails, num_kv_blocks,
                                                   mode, max_tokens):
    prompts = [shared[k % len(shared)] + tail for k, tail in tails]
    if max(map(len, prompts)) + max_tokens > num_kv_blocks * BLOCK_SIZE:
        num_kv_blocks = 64
    executor = executors(num_kv_blocks)
    _, expected = generate(executor, prompts, False, mode, max_tokens)
    _, got = generate(executor, prompts, True, mode, max_tokens)
    assert got == expected


def test_the_ttft_bench_runs_both_sides_on_the_same_requests(tiny_models):
    from bench.studies.prefix_ttft import prefix_ttft
    result = prefix_ttft(tiny_models["llama"], requests=3, system_prompt_len=100,
                         question_len=(4, 8), num_kv_blocks=64)
    assert result.caching.prefix_caching and not result.no_caching.prefix_caching
    assert result.caching.cached_prompt_pct > 80 and result.no_caching.cached_prompt_pct == 0
    assert result.median_ratio > 0
