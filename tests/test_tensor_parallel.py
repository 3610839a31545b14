"""Tensor parallelism (engines/models/tensor_parallel.py, engines/tp_ranks.py) on the tiny
model, on CPU over gloo: each rank holds exactly its slice of the checkpoint, and an
instance at tp 2 (or 4, its 2 KV heads replicated) computes the same logits as one at tp 1
within fp32 tolerance, so greedy tokens on the parity set are the same, through chunked
prefills and preemption; seeded sampling reproduces; a hand-off's KV crosses degrees.

Covers: engines/models/tensor_parallel.py, engines/models/loader.py, engines/tp_ranks.py, engines/tp_wire.py, engines/tp_group.py.
"""
from __future__ import annotations

import pytest
import torch

from engines.offline import Offline
from engines.executors.build import build_executor
from engines.executors.executor_config import ExecutorConfig
from engines.models.attention import SdpaAttention
from engines.models.loader import load_model
from engines.models.model_config import ModelConfig
from engines.models.tensor_parallel import Shard, check_divisible
from engines.models.tokenizer import Tokenizer
from engines.scheduler import SchedulerConfig
from ipc.params import SamplingParams
from tests.test_engine_parity import MAX_TOKENS, TEXTS


@pytest.fixture(scope="module")
def config(tiny_models) -> ModelConfig:
    return ModelConfig.from_pretrained(tiny_models["llama"])


def test_kv_heads_are_split_or_replicated_so_each_rank_keeps_its_query_groups(config):
    # the tiny model: 8 query heads over 2 KV heads (groups of 4)
    assert [list(Shard(r, 2).kv_heads(config)) for r in range(2)] == [[0], [1]]
    assert [list(Shard(r, 4).kv_heads(config)) for r in range(4)] == [[0], [0], [1], [1]]
    for size in (1, 2, 4, 8):
        for rank in range(size):
            shard = Shard(rank, size)
            groups = {h // 4 for h in shard.heads(config)}
            assert groups <= set(shard.kv_heads(config)), (rank, size)


def test_a_degree_the_model_cannot_split_over_is_an_error_naming_tp(config):
    with pytest.raises(ValueError, match=r"tp: the model's 8 attention heads are not "
                                         r"divisible by tp=3"):
        check_divisible(config, 3)
    check_divisible(config, 8)  # 8 heads, the 2 KV heads replicated 4 times


def test_each_rank_reads_exactly_its_slice_of_the_checkpoint(tiny_models, config):
    backend = SdpaAttention(16, torch.device("cpu"))
    whole = dict(load_model(tiny_models["llama"], backend).named_parameters())
    d, q, kv = config.head_dim, config.q_size, config.kv_size
    for rank in range(2):
        part = dict(load_model(tiny_models["llama"], backend,
                               shard=Shard(rank, 2)).named_parameters())
        qkv, full_qkv = part["model.layers.1.self_attn.qkv_proj.weight"], \
            whole["model.layers.1.self_attn.qkv_proj.weight"]
        heads = slice(rank * q // 2, (rank + 1) * q // 2)
        kv_head = slice(rank * d, (rank + 1) * d)
        assert torch.equal(qkv[:q // 2], full_qkv[heads])
        assert torch.equal(qkv[q // 2:q // 2 + d], full_qkv[q:q + kv][kv_head])
        assert torch.equal(qkv[q // 2 + d:], full_qkv[q + kv:][kv_head])
        o = part["model.layers.1.self_attn.o_proj.weight"]
        assert torch.equal(o, whole["model.layers.1.self_attn.o_proj.weight"][:, heads])
        inter = config.intermediate_size // 2
        down = part["model.layers.1.mlp.down_proj.weight"]
        assert torch.equal(down, whole["model.layers.1.mlp.down_proj.weight"][
            :, rank * inter:(rank + 1) * inter])
        assert torch.equal(part["lm_head.weight"], whole["lm_head.weight"])  # replicated


# -- K processes over gloo ---------------------------------------------------------------

def _executor(model_dir, tp, num_kv_blocks=None):
    return build_executor(ExecutorConfig(kind="torch", model_dir=str(model_dir), device="cpu",
                                         tp=tp, num_kv_blocks=num_kv_blocks))


def _close(executor) -> None:
    if executor.ranks is not None:
        executor.ranks.stop()


@pytest.fixture(scope="module")
def prompts(tiny_models) -> list[list[int]]:
    return [Tokenizer(tiny_models["llama"]).encode(t) for t in TEXTS]


def _generate(executor, prompts, sampling, chunk_size=16):
    engine = Offline(executor, SchedulerConfig(mode="sarathi", chunk_size=chunk_size))
    results = engine.generate(prompts, sampling)
    assert engine.core.kv.num_free_blocks == engine.core.kv.num_blocks, "KV blocks leaked"
    return engine, [r.token_ids for r in results]


def _logits(executor, prompts):
    """Each prompt's next-token logits, from one mixed prefill batch."""
    engine = Offline(executor, SchedulerConfig(mode="sarathi", chunk_size=4096))
    for p in prompts:
        engine.add_request(p, SamplingParams(max_tokens=1))
    batch = engine.core.scheduler.schedule(engine.clock())
    logits, _ = executor.compute_logits(batch)
    return logits.clone()


@pytest.mark.slow  # two or four rank processes
@pytest.mark.parametrize("tp", [2, 4])
def test_logits_and_greedy_tokens_equal_one_rank(tiny_models, prompts, tp):
    model_dir = tiny_models["llama"]
    one = _executor(model_dir, 1)
    expected_logits = _logits(one, prompts)
    _, expected = _generate(one, prompts, SamplingParams(max_tokens=MAX_TOKENS))
    many = _executor(model_dir, tp)
    try:
        torch.testing.assert_close(_logits(many, prompts), expected_logits, rtol=1e-4, atol=1e-4)
        _, tokens = _generate(many, prompts, SamplingParams(max_tokens=MAX_TOKENS))
        assert tokens == expected
    finally:
        _close(many)


@pytest.mark.slow  # two rank processes
def test_greedy_through_preemption_and_seeded_sampling_reproduce_at_tp2(tiny_models, prompts):
    model_dir = tiny_models["llama"]
    longest = max(len(p) for p in prompts) + MAX_TOKENS
    few_blocks = -(-longest // 16) + 2  # the longest request fits, all of them together do not
    seeded = [SamplingParams.create(max_tokens=MAX_TOKENS, temperature=0.8, top_p=0.9, seed=i)
              for i in range(len(prompts))]
    one = _executor(model_dir, 1, num_kv_blocks=few_blocks)
    _, expected = _generate(one, prompts, SamplingParams(max_tokens=MAX_TOKENS))
    _, expected_sampled = _generate(one, prompts, seeded)
    two = _executor(model_dir, 2, num_kv_blocks=few_blocks)
    try:
        engine, tokens = _generate(two, prompts, SamplingParams(max_tokens=MAX_TOKENS))
        assert engine.core.scheduler.num_preemptions > 0, "the test must exercise preemption"
        assert tokens == expected
        _, first = _generate(two, prompts, seeded)
        _, again = _generate(two, prompts, seeded)
        assert first == again == expected_sampled
    finally:
        _close(two)


@pytest.mark.slow  # two rank processes
def test_a_handoffs_kv_crosses_tensor_parallel_degrees(tiny_models, prompts):
    """KV exported by a tp-2 instance (every head, gathered from its ranks) imports into a
    tp-1 instance and back, byte for byte."""
    model_dir = tiny_models["llama"]
    one, two = _executor(model_dir, 1), _executor(model_dir, 2)
    try:
        engine = Offline(two, SchedulerConfig(mode="sarathi", chunk_size=4096))
        request = engine.add_request(prompts[2], SamplingParams(max_tokens=8))
        engine.step()
        n = len(prompts[2])
        layout, frames = two.export_kv(request.block_table, n)
        assert layout.num_kv_heads == 2 and layout.num_tokens == n
        blocks = list(range(len(request.block_table)))
        one.import_kv(blocks, layout, frames)
        layout_one, frames_one = one.export_kv(blocks, n)
        assert [bytes(f) for f in frames_one] == [bytes(f) for f in frames]
        back = [b + 40 for b in blocks]
        two.import_kv(back, layout_one, frames_one)
        _, frames_back = two.export_kv(back, n)
        assert [bytes(f) for f in frames_back] == [bytes(f) for f in frames]
    finally:
        _close(two)
