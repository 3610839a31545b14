"""GPU latency profiles: interpolation, monotonicity, the README's reference values,
the `profile:<name>` latency spec on real engine batches, KV capacity."""
from __future__ import annotations

import math

import pytest

from engines.batch import Batch
from engines.batch_shape import batch_shape
from engines.engine import Engine
from engines.executors.latency import make_latency
from engines.executors.profiles import ENV_VAR, PROFILES, get_profile, profiles_dir
from engines.executors.profiles.attention import decode_seconds, prefill_seconds
from engines.executors.sim_executor import SimExecutor
from engines.request import Request
from engines.scheduler import SchedulerConfig
from ipc.params import SamplingParams
from policies.batch_shape import BatchShape
from policies.hardware_spec import HARDWARE
from policies.perf_model import PerfModel


def _data_missing() -> str | None:
    try:
        profiles_dir()
    except FileNotFoundError as exc:
        return str(exc)
    return None


_MISSING = _data_missing()
needs_data = pytest.mark.skipif(
    _MISSING is not None,
    reason=f"third-party GPU profile data not available ({_MISSING}); set {ENV_VAR}")


@pytest.fixture(scope="module")
def readme():
    from bench import profile_refs
    return profile_refs.readme_text()


def test_missing_data_names_the_path_and_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=ENV_VAR) as info:
        profiles_dir()
    assert "nowhere" in str(info.value)


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


@needs_data
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


@needs_data
@pytest.mark.parametrize("name", sorted(PROFILES))
def test_predictions_grow_with_tokens_and_context(name):
    profile = PROFILES[name]
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


@needs_data
def test_summed_ops_table_is_reproduced(readme):
    from bench.profile_refs import summed_ops
    table = summed_ops(readme)
    assert set(table) == {"a100-llama3-8b", "a100-llama2-7b", "h100-llama2-7b", "a100-qwen14b"}
    for name, rows in table.items():
        for tokens, ms in rows.items():
            linear = PROFILES[name].breakdown(BatchShape.prefill_only(tokens)).linear
            assert linear * 1e3 == pytest.approx(ms, rel=0.02), (name, tokens)


@needs_data
def test_attention_spot_values_within_25_percent(readme):
    from bench.profile_refs import decode_spots, prefill_chunk_range
    profile = PROFILES["a100-llama3-8b"]
    args = (profile.model, profile.hardware, profile.attention)
    for context, batch, ms in decode_spots(readme):
        assert decode_seconds([context] * batch, *args) * 1e3 == pytest.approx(ms, rel=0.25)
    chunk, kv_lo, kv_hi, ms_lo, ms_hi = prefill_chunk_range(readme)
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


@needs_data
def test_profile_latency_on_a_real_engine_batch():
    latency = make_latency("profile:a100-llama3-8b")
    batch = _mixed_batch()
    shape = batch_shape(batch)
    assert shape == BatchShape.of(prefills=[(300, 200)], decodes=[51])
    profile = PROFILES["a100-llama3-8b"]
    assert latency(batch) == profile.step_time(shape, num_sampling=1)  # the chunk does not sample
    assert 0.01 < latency(batch) < 0.05
    assert latency(Batch()) == 0.0


@needs_data
def test_sim_executor_runs_on_a_profile():
    slept = []
    executor = SimExecutor(make_latency("profile:h100-llama2-7b"), sleep=slept.append)
    engine = Engine(executor, SchedulerConfig(chunk_size=256))
    done = engine.generate([[1] * 600, [2] * 40], SamplingParams(max_tokens=5))
    assert [len(c.token_ids) for c in done] == [5, 5]
    assert all(0.005 < s < 0.1 for s in slept) and not any(math.isnan(s) for s in slept)
