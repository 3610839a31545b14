"""GPU latency profiles: interpolation, monotonicity, the published reference values,
the `profile:<name>` latency spec on real scheduler batches, KV capacity after vLLM's reserve,
the per-step CPU overhead.

Covers: engines/executors/profiles/.
"""
from __future__ import annotations

import dataclasses
import math

import pytest

from engines.batch import Batch
from engines.executors.latency import make_latency
from engines.executors.profiles import ENV_VAR, PROFILES, get_profile, raw_profiles_dir
from engines.executors.profiles.attention_time import decode_seconds, prefill_seconds
from engines.executors.sim_executor import SimExecutor
from engines.offline import Offline
from engines.request import Request
from engines.scheduler import SchedulerConfig
from ipc.params import SamplingParams
from policies.batch_shape import BatchShape
from engines.perf.hardware_spec import HARDWARE
from engines.perf.model import PerfModel


@pytest.fixture(scope="module")
def refs():
    from bench.data.profile_refs import load_refs
    return load_refs()


def test_missing_data_names_the_path_and_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=ENV_VAR) as info:
        raw_profiles_dir()
    assert "nowhere" in str(info.value)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        make_latency("profile:a100-llama3-8b")


def test_unknown_profile_lists_the_names():
    for bad in ("profile:a100-gpt5", "profile", "profile:"):
        with pytest.raises(ValueError) as info:
            make_latency(bad)
        assert all(name in str(info.value) for name in PROFILES)
    with pytest.raises(ValueError, match="a100-llama3-8b"):
        get_profile("nope")


def test_profiles_carry_shapes_for_the_online_model():
    assert {"a100-llama3-8b", "a100-mistral-7b", "a100-llama2-7b", "h100-llama2-7b",
            "a100-qwen14b"} <= set(PROFILES)
    for name, profile in PROFILES.items():
        assert profile.hardware is HARDWARE[name.split("-")[0]]
        assert PerfModel(profile.model, profile.hardware).predict(BatchShape.prefill_only(64)) > 0


def test_kv_capacity_follows_the_gqa_shape():
    llama3, mistral, qwen = (PROFILES[n] for n in ("a100-llama3-8b", "a100-mistral-7b",
                                                   "a100-qwen14b"))
    assert llama3.kv_bytes_per_token == 128 * 1024 == mistral.kv_bytes_per_token
    assert qwen.kv_bytes_per_token == 800 * 1024
    assert 8.0 < llama3.weight_bytes / 1e9 / 2 < 8.1  # ~8.03 B parameters
    # the paper's orders of magnitude: ~25k blocks for Mistral-7B, ~3k for Qwen-14B
    assert 20_000 < mistral.num_kv_blocks(16) < 35_000
    assert 2_500 < qwen.num_kv_blocks(16) < 5_000
    assert llama3.num_kv_blocks(32) == llama3.kv_capacity_tokens // 32


def test_kv_capacity_is_vllms_budget_after_the_reserve():
    from engines.executors.profiles.kv_capacity import GPU_MEMORY_BYTES
    from engines.executors.profiles.memory_reserve import CUDA_GRAPH_BYTES_PER_LAYER
    llama3 = PROFILES["a100-llama3-8b"]
    model = llama3.model
    # the stated formula at vLLM's defaults (8192 tokens, 256 sequences)
    layer = 2 * 8192 * 3 * (model.intermediate + model.hidden)
    sampler = 3 * 4 * 256 * model.vocab
    assert llama3.activation_bytes() == layer + sampler
    assert 1.20 < llama3.activation_bytes() / 2**30 < 1.22
    assert llama3.cuda_graph_bytes == 32 * CUDA_GRAPH_BYTES_PER_LAYER
    assert 0.41 < llama3.cuda_graph_bytes / 2**30 < 0.43
    assert llama3.total_memory_bytes == GPU_MEMORY_BYTES["a100"] == int(79.15 * 2**30)
    assert PROFILES["h100-llama2-7b"].total_memory_bytes == int(79.22 * 2**30)
    budget = 0.9 * llama3.total_memory_bytes - llama3.weight_bytes - layer - sampler \
        - llama3.cuda_graph_bytes
    assert llama3.kv_capacity_tokens == int(budget // (128 * 1024)) == llama3.kv_capacity()
    assert llama3.num_kv_blocks(16) == llama3.kv_capacity_tokens // 16 == 27979
    # a bigger step (tokens, sequences) reserves more, so fewer blocks fit
    blocks = [llama3.num_kv_blocks(16, t, s) for t, s in
              ((512, 64), (2048, 64), (2048, 256), (8192, 256), (16384, 1024))]
    assert blocks == sorted(blocks, reverse=True) and blocks[0] > blocks[-1]
    small = dataclasses.replace(llama3, memory_bytes=16 * 2**30)
    with pytest.raises(ValueError, match="do not fit"):
        small.kv_capacity_tokens  # noqa: B018


def test_kv_capacity_matches_vllms_published_figures():
    from bench.studies.profile_check import PUBLISHED_ACTIVATION, PUBLISHED_KV_BLOCKS
    for name, tokens, seqs, published, _ in PUBLISHED_KV_BLOCKS:
        assert PROFILES[name].num_kv_blocks(16, tokens, seqs) == pytest.approx(published,
                                                                               rel=0.02)
    for name, tokens, seqs, gib, _ in PUBLISHED_ACTIVATION:
        assert PROFILES[name].activation_bytes(tokens, seqs) / 2**30 == pytest.approx(gib,
                                                                                      rel=0.05)


def test_cpu_overhead_grows_with_the_batch_and_matches_vidur():
    from engines.executors.profiles.cpu_overhead import VIDUR_POINTS
    profile = PROFILES["a100-llama3-8b"]
    cpu = profile.cpu_overhead
    # the stated lines at the stated points
    assert cpu.seconds(8, 8) == pytest.approx(0.259e-3 + 0.453e-3 + 8 * (5.85e-6 + 5.30e-6))
    assert cpu.seconds(8, 8) * 1e3 == pytest.approx(0.801, abs=5e-4)
    assert cpu.seconds(128, 128) * 1e3 == pytest.approx(2.139, abs=5e-4)
    for batch, ms in VIDUR_POINTS:  # Vidur's A100 medians, prepare_inputs + sampler
        assert cpu.seconds(batch, batch) * 1e3 == pytest.approx(ms, rel=0.06)
    by_seqs = [cpu.seconds(n, n) for n in (1, 8, 32, 128, 512)]
    assert by_seqs == sorted(by_seqs) and by_seqs[-1] > 2 * by_seqs[0]
    assert cpu.seconds(4, 0) == pytest.approx(0.259e-3 + 4 * 5.85e-6)  # nothing samples
    assert cpu.seconds(4, 0) < cpu.seconds(4, 1) < cpu.seconds(4, 4)
    assert cpu.seconds(0, 0) == 0.0
    # a decode step carries it, and more decodes cost more overhead
    steps = [profile.breakdown(BatchShape.of(decodes=[1000] * b)) for b in (1, 32, 256)]
    assert [s.overhead for s in steps] == [cpu.seconds(b, b) for b in (1, 32, 256)]
    chunk = profile.breakdown(BatchShape.prefill_only(512, 512), num_sampling=0)
    assert chunk.overhead == cpu.seconds(1, 0)


def test_interpolation_hits_measured_points_and_scales_past_the_last():
    ops = PROFILES["a100-llama3-8b"].ops
    for i in range(0, len(ops.tokens), 37):
        assert ops.layer(ops.tokens[i]) == pytest.approx(ops.layer_s[i], rel=1e-12)
    lo, hi = ops.tokens[20], ops.tokens[21]
    mid = ops.layer((lo + hi) / 2)
    assert min(ops.layer_s[20], ops.layer_s[21]) <= mid <= max(ops.layer_s[20], ops.layer_s[21])
    last = ops.tokens[-1]
    assert ops.layer(2 * last) == pytest.approx(2 * ops.layer_s[-1])
    assert ops.layer(0) == 0.0


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_predictions_grow_with_tokens_and_context(name):
    profile = PROFILES[name]
    if profile.model.layers == 80:  # a 70B runs over several GPUs; Vidur's rows at tp 1 (and
        profile = profile.at_tp(4)  # h100's at tp 8) have a 1-token step slower than 8 (noise)
    sizes = (1, 64, 256, 1024, 4096, 8192)
    prefill = [profile.step_time(BatchShape.prefill_only(n)) for n in sizes]
    assert prefill == sorted(prefill)
    cached = [profile.step_time(BatchShape.prefill_only(512, l)) for l in (0, 1024, 4096, 16384)]
    assert cached == sorted(cached) and cached[-1] > cached[0]
    context = [profile.step_time(BatchShape.of(decodes=[n] * 32)) for n in (128, 1024, 4096, 16384)]
    assert context == sorted(context) and context[-1] > context[0]
    batch = [profile.step_time(BatchShape.of(decodes=[1000] * b)) for b in (1, 8, 64, 256)]
    assert batch == sorted(batch) and batch[-1] > batch[0]
    assert profile.step_time(BatchShape()) == 0.0


def test_summed_ops_table_is_reproduced(refs):
    table = refs.summed_ops
    assert set(table) == {"a100-llama3-8b", "a100-llama2-7b", "h100-llama2-7b", "a100-qwen14b"}
    for name, rows in table.items():
        for tokens, ms in rows.items():
            linear = PROFILES[name].breakdown(BatchShape.prefill_only(tokens)).linear
            assert linear * 1e3 == pytest.approx(ms, rel=0.02), (name, tokens)


def test_attention_spot_values_within_25_percent(refs):
    profile = PROFILES["a100-llama3-8b"]
    args = (profile.model, profile.hardware, profile.attention)
    for context, batch, ms in refs.decode_spots:
        assert decode_seconds([context] * batch, *args) * 1e3 == pytest.approx(ms, rel=0.25)
    chunk, kv_lo, kv_hi, ms_lo, ms_hi = refs.prefill_chunk_range
    for kv, ms in ((kv_lo, ms_lo), (kv_hi, ms_hi)):
        assert prefill_seconds([chunk], [kv], *args) * 1e3 == pytest.approx(ms, rel=0.25)


def _mixed_batch() -> Batch:
    """A 300-token prefill chunk after 200 cached tokens, and a decode at context 51."""
    params = SamplingParams(max_tokens=8)
    prefill = Request("p", list(range(1, 801)), params)
    prefill.num_computed_tokens = 200
    decode = Request("d", list(range(1, 51)), params)
    decode.token_ids.append(7)
    decode.num_computed_tokens = 50
    batch = Batch()
    batch.add(prefill, 300)
    batch.add(decode, 1)
    return batch


def test_profile_latency_on_a_real_engine_batch():
    latency = make_latency("profile:a100-llama3-8b")
    batch = _mixed_batch()
    shape = batch.shape()
    assert shape == BatchShape.of(prefills=[(300, 200)], decodes=[51])
    profile = PROFILES["a100-llama3-8b"]
    assert latency(batch) == profile.step_time(shape, num_sampling=1)  # the chunk does not sample
    assert 0.01 < latency(batch) < 0.05
    assert latency(Batch()) == 0.0


def test_sim_executor_runs_on_a_profile():
    slept = []
    executor = SimExecutor(make_latency("profile:h100-llama2-7b"), sleep=slept.append)
    offline = Offline(executor, SchedulerConfig(chunk_size=256))
    done = offline.generate([[1] * 600, [2] * 40], SamplingParams(max_tokens=5))
    assert [len(c.token_ids) for c in done] == [5, 5]
    assert all(0.005 < s < 0.1 for s in slept) and not any(math.isnan(s) for s in slept)
