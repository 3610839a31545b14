"""Scheduler behaviour with a model-free executor: batching rules, preemption, KV hygiene.

Covers: engines/scheduler.py, engines/kv_cache.py.
"""
from __future__ import annotations

import dataclasses
import random

import pytest

from engines.kv_cache import BlockManager
from engines.modes import get_mode
from engines.offline import Offline
from engines.request import Request, RequestStatus
from engines.scheduler import Scheduler, SchedulerConfig
from ipc.params import SamplingParams
from policies.predictor import LinearPredictor
from tests.fakes import FakeExecutor, expected_output


def make_prompts(n: int, seed: int = 0, lo: int = 3, hi: int = 40) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, 50) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


def run(mode: str, prompts, max_tokens=12, chunk_size=16, num_kv_blocks=64, **kw):
    executor = FakeExecutor(num_kv_blocks=num_kv_blocks)
    offline = Offline(executor, SchedulerConfig(mode=mode, chunk_size=chunk_size, **kw))
    sampling = SamplingParams(max_tokens=max_tokens)
    return offline, executor, offline.generate(prompts, sampling)


@pytest.mark.parametrize("mode", ["sarathi", "vllm"])
def test_every_request_completes_with_the_models_tokens(mode):
    prompts = make_prompts(10)
    offline, _, results = run(mode, prompts)
    for prompt, result in zip(prompts, results):
        assert result.token_ids == expected_output(prompt, 12)
        assert result.finish_reason == "length"
    assert offline.core.kv.num_free_blocks == offline.core.kv.num_blocks


@pytest.mark.parametrize("mode", ["sarathi", "vllm"])
def test_preemption_by_recompute_loses_nothing(mode):
    prompts = make_prompts(8, seed=1, lo=10, hi=30)
    # 20 blocks of 4 tokens cannot hold 8 requests of up to 30 + 20 tokens: preemption must happen.
    offline, _, results = run(mode, prompts, max_tokens=20, num_kv_blocks=20)
    assert offline.core.scheduler.num_preemptions > 0
    assert sum(r.num_preemptions for r in results) == offline.core.scheduler.num_preemptions
    for prompt, result in zip(prompts, results):
        assert result.token_ids == expected_output(prompt, 20)
    assert offline.core.kv.num_free_blocks == offline.core.kv.num_blocks


def test_sarathi_keeps_token_budget_and_never_skips_a_decode():
    prompts = make_prompts(24, seed=2, lo=5, hi=60)
    executor = FakeExecutor(num_kv_blocks=60)
    offline = Offline(executor, SchedulerConfig(mode="sarathi", chunk_size=16, max_num_seqs=8))
    for p in prompts:
        offline.add_request(p, SamplingParams(max_tokens=10))
    scheduler = offline.core.scheduler
    saw_chunked_prefill = saw_mixed = False
    while offline.core.has_work:
        decoding = [r for r in scheduler.running if r.is_decoding]
        batch = scheduler.schedule(0.0)
        assert batch.num_tokens <= 16
        assert len(scheduler.running) <= 8
        in_batch = {c.request.request_id for c in batch.chunks}
        for r in decoding:
            assert r.request_id in in_batch or r.status is RequestStatus.WAITING, \
                "a running decode was skipped (not preempted)"
        first_prefill = next((i for i, c in enumerate(batch.chunks) if not c.is_decode), len(batch))
        assert all(not c.is_decode for c in batch.chunks[first_prefill:]), "decodes come first"
        saw_chunked_prefill |= any(not c.samples for c in batch.chunks)
        saw_mixed |= 0 < first_prefill < len(batch)
        scheduler.update(batch, executor.execute(batch), 0.0)
    assert saw_chunked_prefill and saw_mixed
    assert offline.core.kv.num_free_blocks == offline.core.kv.num_blocks


def test_sarathi_cuts_a_long_prompt_into_budget_sized_chunks():
    offline, executor, _ = run("sarathi", [list(range(2, 52))], max_tokens=1, chunk_size=16)
    assert [c.num_tokens for b in executor.batches for c in b.chunks] == [16, 16, 16, 2]


def test_vllm_admits_prefills_first_and_decodes_wait():
    executor = FakeExecutor(num_kv_blocks=200)
    offline = Offline(executor, SchedulerConfig(mode="vllm", chunk_size=64))
    first = offline.add_request(list(range(2, 12)), SamplingParams(max_tokens=5))
    offline.step()  # first's whole prompt
    assert first.is_decoding
    offline.add_request(list(range(50, 88)), SamplingParams(max_tokens=5))  # nothing shared
    batch = offline.core.scheduler.schedule(0.0)
    assert [c.is_decode for c in batch.chunks] == [False], "the waiting prompt runs, the decode waits"
    assert batch.chunks[0].num_tokens == 38, "vllm never chunks a prompt"
    offline.core.scheduler.update(batch, executor.execute(batch), 0.0)
    batch = offline.core.scheduler.schedule(0.0)
    assert [c.is_decode for c in batch.chunks] == [True, True]


def test_abort_frees_blocks_wherever_the_request_is():
    executor = FakeExecutor(num_kv_blocks=64)
    offline = Offline(executor, SchedulerConfig(mode="sarathi", chunk_size=16))
    reqs = [offline.add_request(p, SamplingParams(max_tokens=30)) for p in make_prompts(6, seed=3)]
    offline.step()
    offline.step()
    states = {r.status for r in reqs}
    assert RequestStatus.RUNNING in states and RequestStatus.WAITING in states
    for r in reqs:
        assert offline.core.scheduler.abort(r.request_id)
        assert r.finish_reason.value == "abort"
    assert not offline.core.scheduler.abort(reqs[0].request_id), "finished: nothing to abort"
    assert not offline.core.has_work
    assert offline.core.kv.num_free_blocks == offline.core.kv.num_blocks


def test_abort_between_schedule_and_update_is_harmless():
    executor = FakeExecutor()
    offline = Offline(executor, SchedulerConfig(mode="sarathi", chunk_size=16))
    a = offline.add_request([5, 6, 7], SamplingParams(max_tokens=4))
    b = offline.add_request([8, 9], SamplingParams(max_tokens=4))
    batch = offline.core.scheduler.schedule(0.0)
    sampled = executor.execute(batch)
    offline.core.scheduler.abort(a.request_id)
    tokens = offline.core.scheduler.update(batch, sampled, 0.0)
    assert tokens.request_ids == [b.request_id]
    assert b.output_token_ids == expected_output([8, 9], 1)


def test_eos_and_stop_tokens_finish_with_stop():
    prompt = [7, 8, 9]
    first, second = expected_output(prompt, 2)
    assert first != second
    executor = FakeExecutor(eos_token_ids=frozenset({second}))
    offline = Offline(executor, SchedulerConfig(mode="sarathi", chunk_size=16))
    stopped, = offline.generate([prompt], SamplingParams(max_tokens=10))
    assert stopped.token_ids == [first, second] and stopped.finish_reason == "stop"
    ignoring, = offline.generate([prompt], SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(ignoring.token_ids) == 3 and ignoring.finish_reason == "length"
    by_stop_id, = offline.generate([prompt], SamplingParams(max_tokens=10, stop_token_ids=[first]))
    assert by_stop_id.token_ids == [first] and by_stop_id.finish_reason == "stop"


def test_context_limit_ends_generation_with_length():
    executor = FakeExecutor(max_model_len=20)
    offline = Offline(executor, SchedulerConfig(mode="sarathi", chunk_size=16))
    result, = offline.generate([list(range(2, 17))], SamplingParams(max_tokens=100))
    assert len(result.token_ids) == 5 and result.finish_reason == "length"


def test_bad_requests_and_configs_are_refused_with_a_reason():
    scheduler = Scheduler(SchedulerConfig(chunk_size=16), BlockManager(8, 4), max_model_len=1000)
    with pytest.raises(ValueError, match="at most 31 prompt tokens"):
        scheduler.add_request(Request("long", list(range(40)), SamplingParams()))
    scheduler.add_request(Request("x", [1, 2], SamplingParams()))
    with pytest.raises(ValueError, match="duplicate request id"):
        scheduler.add_request(Request("x", [1, 2], SamplingParams()))
    with pytest.raises(ValueError, match="max_num_seqs"):
        Scheduler(SchedulerConfig(chunk_size=16, max_num_seqs=32), BlockManager(8, 4), 100)
    with pytest.raises(ValueError, match="unknown scheduler mode 'fifo'"):
        Scheduler(SchedulerConfig(mode="fifo"), BlockManager(8, 4), 100)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams.create(max_tokens=0)
    with pytest.raises(ValueError, match="prompt has no tokens"):
        Request("empty", [], SamplingParams())


def _with_a_young_decode(mode: str, whole_prefill: bool) -> Scheduler:
    """An LP or HP whose one running request has just had its first token, with a 30 ms
    TBT target: the compute budget leaves a step about 27 ms of prefill (1 ms a token)."""
    scheduler = Scheduler(SchedulerConfig(mode=mode, chunk_size=64), BlockManager(200, 16),
                          max_model_len=4096,
                          predictor=LinearPredictor(seconds_per_token=0.001, fixed=0.002))
    scheduler.mode = dataclasses.replace(scheduler.mode, whole_prefill_for_ttft=whole_prefill)
    scheduler.add_request(Request("decoding", [5] * 8, SamplingParams(max_tokens=50),
                                  tbt_slo=0.03))
    batch = scheduler.schedule(now=0.0)
    scheduler.update(batch, [7], now=0.0)
    return scheduler


@pytest.mark.parametrize("mode", ["lp", "hp"])
@pytest.mark.parametrize("deadline, whole", [(0.22, True), (0.30, False), (0.19, False)])
def test_a_prompt_runs_whole_only_when_that_alone_meets_its_ttft(mode, deadline, whole):
    """200 prompt tokens: 0.202 s whole beside the decode's 3 ms; in chunks of 27 ms, eight
    steps of 30 ms: 0.24 s. Due at 0.22 s it gets the whole step (token budget and TBT budget both
    overspent, once); due at 0.30 s chunks make it; due at 0.19 s it is lost either way,
    and nobody's TBT is spent on it. An instance without the rule always chunks."""
    assert get_mode(mode).whole_prefill_for_ttft
    for rule in (True, False):
        scheduler = _with_a_young_decode(mode, rule)
        scheduler.add_request(Request("long", list(range(1, 201)), SamplingParams(max_tokens=4),
                                      deadline=deadline))
        batch = scheduler.schedule(now=0.0)
        prefill = {c.request.request_id: c.num_tokens for c in batch.chunks if not c.is_decode}
        assert "decoding" in [c.request.request_id for c in batch.chunks if c.is_decode]
        assert (prefill.get("long") == 200) == (rule and whole)
        assert 0 < prefill["long"] <= (200 if rule and whole else 27)
