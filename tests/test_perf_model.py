"""The performance model: batch shapes, roofline features, the NNLS fit and its bookkeeping.
Pure arithmetic on synthetic data: no executor, no clock.

Covers: engines/perf/, policies/batch_shape.py.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from policies.batch_shape import BatchShape
from engines.perf.calibration_shapes import calibration_shapes, kv_tokens, random_shapes
from engines.perf.hardware_spec import HARDWARE, HardwareSpec, hardware_for_device
from engines.perf.model_shape import ModelShape
from engines.perf.nnls import nnls
from engines.perf.features import (bytes_and_flops, decode_attention, prefill_attention,
                                    prefill_bytes_and_flops, times)
from engines.perf.model import PerfModel, feature_rows

LLAMA3_8B = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                       intermediate=14336, vocab=128256)
A100 = HARDWARE["a100"]
TRUE = np.array([0.3, 1.2, 0.4, 0.1, 0.004])  # C1..C5 of the synthetic "device"


def flops(shape, model=LLAMA3_8B):
    return bytes_and_flops(shape, model)[1]


def moved(shape, model=LLAMA3_8B):
    return bytes_and_flops(shape, model)[0]


def true_seconds(shape, model=LLAMA3_8B, hw=A100):
    return float(feature_rows(*times(shape, model, hw)) @ TRUE)


def synthetic(count, seed=0, noise=0.03):
    """(shape, seconds) pairs from the formula with TRUE coefficients and relative noise."""
    rng = np.random.default_rng(seed)
    shapes = random_shapes(count, 2048, 8192, 128, seed=seed)
    return [(s, true_seconds(s) * (1 + noise * rng.standard_normal())) for s in shapes]


# -- BatchShape ---------------------------------------------------------------------------

def test_batch_shape_constructors_and_num_tokens():
    shape = BatchShape.of(prefills=[(100, 0), (28, 500)], decodes=[10, 20, 30])
    assert shape.num_tokens == 131 and shape.num_seqs == 5
    assert shape.prefill_tokens.tolist() == [100, 28]
    assert shape.prefill_cached.tolist() == [0, 500]
    assert BatchShape.prefill_only(64, already=32) == BatchShape.of(prefills=[(64, 32)])
    assert BatchShape.of().num_tokens == 0


def test_batch_shape_is_immutable_and_validated():
    shape = BatchShape.of(decodes=[5])
    with pytest.raises(AttributeError):
        shape.decode_context = np.array([6])
    with pytest.raises(ValueError):
        shape.decode_context[0] = 6
    with pytest.raises(ValueError):
        BatchShape.of(prefills=[(0, 3)])
    with pytest.raises(ValueError):
        BatchShape.of(decodes=[-1])
    assert hash(shape) == hash(BatchShape.of(decodes=[5]))


# -- features -----------------------------------------------------------------------------

def test_more_tokens_more_flops_and_bytes():
    sizes = [1, 16, 256, 2048]
    f = [flops(BatchShape.prefill_only(n)) for n in sizes]
    m = [moved(BatchShape.prefill_only(n)) for n in sizes]
    assert f == sorted(f) and len(set(f)) == len(f)
    assert m == sorted(m) and len(set(m)) == len(m)


def test_decode_bytes_grow_with_context():
    m = [moved(BatchShape.of(decodes=[ctx] * 32)) for ctx in (128, 1024, 8192)]
    assert m[0] < m[1] < m[2]
    # 32 decodes x 7168 more tokens x K and V x kv width x 2 bytes x 32 layers
    extra = 32 * 7168 * 2 * 8 * 128 * 2 * 32
    assert m[2] - m[1] == pytest.approx(extra)


def test_gqa_fewer_kv_heads_fewer_kv_bytes():
    mha = ModelShape(**{**LLAMA3_8B.__dict__, "kv_heads": 32})
    shape = BatchShape.of(decodes=[4096] * 16)
    assert moved(shape, LLAMA3_8B) < moved(shape, mha)
    # the attention FLOPs depend on the query heads only
    assert prefill_attention(100, 500, LLAMA3_8B)[1] == prefill_attention(100, 500, mha)[1]
    # Llama-3-8B KV cache: 128 KiB per token (the paper's 512 KB ignores GQA)
    assert 2 * LLAMA3_8B.kv_size * 2 * LLAMA3_8B.layers == 128 * 1024


def test_prefill_attention_flops_are_quadratic():
    _, f1 = prefill_attention(1000, 0, LLAMA3_8B)
    _, f2 = prefill_attention(2000, 0, LLAMA3_8B)
    assert f2 / f1 == pytest.approx(4, rel=1e-3)
    # the whole model is linear GEMMs plus that quadratic part
    lin = flops(BatchShape.prefill_only(2000)) - f2 * 32
    assert lin == pytest.approx(2 * (flops(BatchShape.prefill_only(1000)) - f1 * 32)
                                - 2 * 128256 * 4096, rel=1e-9)


def test_chunk_attends_to_cached_context():
    # the second half of a prompt costs more attention than the first half
    first, second = BatchShape.prefill_only(512), BatchShape.prefill_only(512, already=512)
    assert flops(second) > flops(first) and moved(second) > moved(first)
    # chunks add up to the unchunked prefill, except the GEMMs' weights and LM head are paid twice
    whole = prefill_attention(1024, 0, LLAMA3_8B)[1]
    parts = prefill_attention(512, 0, LLAMA3_8B)[1] + prefill_attention(512, 512, LLAMA3_8B)[1]
    assert parts == pytest.approx(whole)


def test_one_token_chunk_costs_what_a_decode_does():
    for ctx in (1, 17, 5000):
        assert prefill_attention(1, ctx - 1, LLAMA3_8B) == pytest.approx(
            decode_attention(ctx, LLAMA3_8B))
    assert bytes_and_flops(BatchShape.prefill_only(1, 99), LLAMA3_8B) == pytest.approx(
        bytes_and_flops(BatchShape.of(decodes=[100]), LLAMA3_8B))


def test_vectorised_prefill_matches_shapes():
    c, l = np.array([1, 64, 700, 0]), np.array([0, 100, 3000, 5])
    m, f = prefill_bytes_and_flops(c, l, LLAMA3_8B)
    for i in range(3):
        assert (m[i], f[i]) == pytest.approx(bytes_and_flops(
            BatchShape.prefill_only(int(c[i]), int(l[i])), LLAMA3_8B))
    assert m[3] == 0 and f[3] == 0


def test_roofline_magnitudes_for_llama3_8b_on_a100():
    """Order-of-magnitude checks against the public profiles (profiles/README.md)."""
    t_m, t_f = times(BatchShape.of(decodes=[512]), LLAMA3_8B, A100)
    assert t_m > 10 * t_f and 0.006 < t_m < 0.010  # ~16 GB of weights at 2 TB/s
    t_m, t_f = times(BatchShape.prefill_only(2048), LLAMA3_8B, A100)
    assert t_f > 5 * t_m and 0.08 < t_f < 0.12    # ~30 TFLOP at 312 TFLOP/s


def test_model_shape_from_hf_dict_and_attributes():
    raw = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
           "intermediate_size": 14336, "num_hidden_layers": 32, "vocab_size": 128256,
           "torch_dtype": "bfloat16"}
    assert ModelShape.from_config(raw) == LLAMA3_8B

    class Config:
        hidden_size, num_attention_heads, num_key_value_heads, head_dim = 256, 8, 2, 32
        intermediate_size, num_hidden_layers, vocab_size, torch_dtype = 688, 4, 1024, "float32"

    shape = ModelShape.from_config(Config())
    assert (shape.kv_size, shape.bytes_per_element) == (64, 4)
    assert ModelShape.from_config(Config(), bytes_per_element=2).bytes_per_element == 2


def test_hardware_registry():
    assert (HARDWARE["a100"].peak_flops, HARDWARE["a100"].bandwidth) == (312e12, 2.0e12)
    assert HARDWARE["h200"].bandwidth > HARDWARE["h100"].bandwidth
    assert hardware_for_device("NVIDIA H100 80GB HBM3") is HARDWARE["h100"]
    assert hardware_for_device("Intel Xeon") is None
    cpu = HardwareSpec.measured("cpu", 1e11, 2e10)
    assert cpu.source == "measured"
    with pytest.raises(ValueError):
        HardwareSpec("bad", 0, 1)


# -- NNLS ---------------------------------------------------------------------------------

def test_nnls_satisfies_kkt_on_random_problems():
    rng = np.random.default_rng(3)
    for _ in range(20):
        a, b = rng.standard_normal((30, 5)), rng.standard_normal(30)
        x = nnls(a, b)
        grad = a.T @ (a @ x - b)
        assert x.min() >= 0
        assert np.all(grad >= -1e-8)                      # no descent direction left
        assert np.allclose(grad[x > 0], 0, atol=1e-8)     # stationary on the support


def fitted(data, **options) -> PerfModel:
    perf = PerfModel(LLAMA3_8B, A100, **options)
    for shape, seconds in data:
        perf.observe(shape, seconds)
    assert perf.refit()
    return perf


def test_fit_recovers_known_coefficients():
    c = np.array(fitted(synthetic(300, noise=0)).coefficients)
    assert c.min() >= 0
    # C1 (t_M + t_F) = C1 t_M + C1 t_F: only these combinations are identifiable
    assert c[0] + c[2] == pytest.approx(TRUE[0] + TRUE[2], rel=1e-6)
    assert c[0] + c[3] == pytest.approx(TRUE[0] + TRUE[3], rel=1e-6)
    assert c[[1, 4]] == pytest.approx(TRUE[[1, 4]], rel=1e-6)


def test_fit_on_noisy_data_predicts_well():
    """With 3% noise the constant and the memory term trade off (most memory-bound batches
    read about the same weights), but C2 holds and predictions stay within the noise."""
    perf = fitted(synthetic(600, noise=0.03))
    c = np.array(perf.coefficients)
    assert c.min() >= 0
    assert c[1] == pytest.approx(TRUE[1], rel=0.05)
    assert perf.mape < 0.04
    fresh = synthetic(200, seed=7, noise=0)
    assert np.mean([abs(perf.predict(s) - t) / t for s, t in fresh]) < 0.02


def test_mape_is_measured_on_held_out_samples_only():
    """Every 5th observation is tripled: the fit never sees them, so it stays exact on the
    rest, and the reported MAPE is exactly the held-out corruption, |1 - 3| / 3."""
    perf = PerfModel(LLAMA3_8B, A100, holdout_every=5)
    for i, (shape, _) in enumerate(synthetic(200, noise=0)):
        perf.observe(shape, true_seconds(shape) * (3 if i % 5 == 4 else 1))
    perf.refit()
    assert perf.mape == pytest.approx(2 / 3, rel=1e-6)
    shape = BatchShape.of(prefills=[(300, 200)], decodes=[1000] * 20)
    assert perf.predict(shape) == pytest.approx(true_seconds(shape), rel=1e-6)


def test_bad_default_coefficients_improve_with_observations():
    perf = PerfModel(LLAMA3_8B, A100, coeffs=(0, 10, 0, 0, 0.1))
    test = synthetic(100, seed=9, noise=0)

    def error():
        return np.mean([abs(perf.predict(s) - t) / t for s, t in test])

    before = error()
    assert perf.mape is None
    for shape, seconds in synthetic(300, seed=1):
        perf.observe(shape, seconds)
        if perf.should_refit():
            perf.refit()
    assert error() < 0.05 < before
    assert perf.mape is not None and perf.mape < 0.05


def test_refit_policy_and_bad_observations():
    perf = PerfModel(LLAMA3_8B, A100, min_fit_samples=10, refit_every=50)
    data = synthetic(200)
    for shape, seconds in data[:11]:
        perf.observe(shape, seconds)
    assert not perf.should_refit()          # 9 training samples: too few
    assert not perf.refit()
    perf.observe(*data[11])
    assert perf.should_refit() and perf.refit()
    assert not perf.should_refit()
    assert perf.should_refit(num_new=50)
    perf.observe(data[12][0], 0.0)          # ignored: no time, NaN, empty batch
    perf.observe(data[12][0], float("nan"))
    perf.observe(BatchShape.of(), 1.0)
    assert perf.num_samples == 12


def test_window_is_bounded():
    perf = PerfModel(LLAMA3_8B, A100, window=100)
    for shape, seconds in synthetic(300):
        perf.observe(shape, seconds)
    assert perf.num_samples == 100


def test_to_dict_round_trip():
    perf = fitted(synthetic(100))
    copy = PerfModel.from_dict(json.loads(json.dumps(perf.to_dict())))
    assert copy.coefficients == perf.coefficients and copy.mape == perf.mape
    assert copy.model == LLAMA3_8B and copy.hw == A100
    shape = BatchShape.of(prefills=[(512, 0)], decodes=[100, 200])
    assert copy.predict(shape) == perf.predict(shape)


def test_default_prediction_is_the_roofline():
    perf = PerfModel(LLAMA3_8B, A100)
    shape = BatchShape.prefill_only(1024)
    assert perf.predict(shape) == pytest.approx(max(times(shape, LLAMA3_8B, A100)) + 1e-3)
    assert perf.predict(BatchShape.of()) == 0.0
    assert perf.batch_time(shape) == perf.predict(shape)


# -- convenience predictions ------------------------------------------------------------

def test_prefill_time_with_token_budget_sums_chunks():
    perf = PerfModel(LLAMA3_8B, A100, coeffs=TRUE)
    chunks = [BatchShape.prefill_only(512, 100), BatchShape.prefill_only(512, 612),
              BatchShape.prefill_only(276, 1124)]
    assert perf.prefill_time(1300, already=100, token_budget=512) == pytest.approx(
        sum(perf.predict(s) for s in chunks))
    assert perf.prefill_time(1300, already=100) == pytest.approx(
        perf.predict(BatchShape.prefill_only(1300, 100)))
    # chunking costs more: the weights are read once per chunk
    assert perf.prefill_time(4096, token_budget=512) > perf.prefill_time(4096)
    assert perf.prefill_time(0) == 0.0


def test_full_batch_time_is_one_budget_of_fresh_prefill():
    perf = PerfModel(LLAMA3_8B, A100, coeffs=TRUE)
    assert perf.full_batch_time(2048) == perf.predict(BatchShape.prefill_only(2048))
    assert perf.full_batch_time(2048) == perf.prefill_time(2048)


def test_prefill_times_is_vectorised():
    perf = PerfModel(LLAMA3_8B, A100, coeffs=TRUE)
    tokens, already = [700, 0, 3000, 1], [0, 50, 1000, 4000]
    for budget in (None, 512):
        got = perf.prefill_times(tokens, already, token_budget=budget)
        want = [perf.prefill_time(n, a, budget) for n, a in zip(tokens, already)]
        assert got == pytest.approx(want)


@pytest.mark.parametrize("model", [LLAMA3_8B, ModelShape(
    layers=3, hidden=96, heads=6, kv_heads=2, head_dim=16, intermediate=200, vocab=1000,
    bytes_per_element=4, attn_block=100)])
def test_one_prediction_and_many_are_equal_to_the_last_bit(model):
    """The schedulers keep predictions made one at a time beside ones made for a whole
    queue at once (after a refit); the two must never disagree, even in the last bit."""
    rng = np.random.default_rng(5)
    perf = PerfModel(model, A100, coeffs=TRUE)
    tokens = np.concatenate([[0, 1, 2, 511, 512, 513], rng.integers(1, 5000, 60)])
    already = rng.integers(0, 20000, tokens.size)
    for budget in (None, 7, 512, 2048):
        many = perf.prefill_times(tokens, already, token_budget=budget).tolist()
        one = [perf.prefill_time(int(n), int(a), budget) for n, a in zip(tokens, already)]
        assert many == one
        assert perf.prefill_rows(tokens, already, budget).tolist() == [
            list(perf._prefill_row(int(n), int(a), budget)) for n, a in zip(tokens, already)]


def test_a_refit_moves_the_version_and_every_prediction_at_once():
    perf = PerfModel(LLAMA3_8B, A100)
    asked = [(n, 0, 512) for n in (100, 700, 3000)]
    before = [perf.prefill_time(*q) for q in asked], perf.full_batch_time(512)
    version = perf.version
    for shape, seconds in synthetic(200, noise=0.0):
        perf.observe(shape, seconds)
    assert perf.refit() and perf.version == version + 1
    fresh = PerfModel(LLAMA3_8B, A100, coeffs=perf.coefficients)
    after = [perf.prefill_time(*q) for q in asked], perf.full_batch_time(512)
    assert after == ([fresh.prefill_time(*q) for q in asked], fresh.full_batch_time(512))
    assert after != before
    perf.refit()  # the same data again: the same coefficients, nothing to redo
    assert perf.version == version + 1


# -- synthetic batch sets --------------------------------------------------------------

def test_calibration_shapes_cover_the_three_kinds_within_limits():
    shapes = calibration_shapes(512, 2048, 128, max_kv_tokens=50_000)
    assert shapes == calibration_shapes(512, 2048, 128, max_kv_tokens=50_000)
    assert 15 <= len(shapes) <= 40
    kinds = {(s.num_prefills > 0, s.num_decodes > 0) for s in shapes}
    assert kinds == {(True, False), (False, True), (True, True)}
    for s in shapes:
        assert 0 < s.num_tokens <= 512 and kv_tokens(s) <= 50_000
        assert max((s.prefill_tokens + s.prefill_cached).max(initial=0),
                   s.decode_context.max(initial=0)) <= 2048
    assert max(s.num_decodes for s in shapes) == 128


def test_random_shapes_fit_their_limits():
    shapes = random_shapes(50, 256, 1024, 32, max_kv_tokens=4000, seed=4)
    assert shapes == random_shapes(50, 256, 1024, 32, max_kv_tokens=4000, seed=4)
    for s in shapes:
        assert 0 < s.num_tokens <= 256 and s.num_decodes <= 32 and kv_tokens(s) <= 4000


def test_the_per_step_float_paths_equal_the_array_formulas():
    """bytes_and_flops and the profile's attention_seconds sum in plain floats for speed;
    they must give what the array functions (the documented formulas) give."""
    import random

    from engines.executors.profiles.attention_time import (
        attention_seconds, decode_seconds, prefill_seconds,
    )
    from engines.executors.profiles.registry import get_profile
    from engines.perf.features import (
        _whole_model, bytes_and_flops, decode_attention, prefill_attention,
    )
    profile, rng = get_profile("a100-llama3-8b"), random.Random(0)
    for _ in range(100):
        prefills = [(rng.randint(1, 3000), rng.randint(0, 6000)) for _ in range(rng.randint(0, 3))]
        decodes = [rng.randint(1, 8000) for _ in range(rng.randint(0 if prefills else 1, 300))]
        shape = BatchShape.of(prefills=prefills, decodes=decodes)
        p_moved, p_flops = prefill_attention(shape.prefill_tokens, shape.prefill_cached, LLAMA3_8B)
        d_moved, d_flops = decode_attention(shape.decode_context, LLAMA3_8B)
        expected = _whole_model(shape.num_tokens, shape.num_seqs, p_moved.sum() + d_moved.sum(),
                                p_flops.sum() + d_flops.sum(), LLAMA3_8B)
        assert bytes_and_flops(shape, LLAMA3_8B) == pytest.approx(expected, rel=1e-12)
        seconds = (prefill_seconds(shape.prefill_tokens, shape.prefill_cached, profile.model,
                                   profile.hardware)
                   + decode_seconds(shape.decode_context, profile.model, profile.hardware))
        assert attention_seconds(shape, profile.model, profile.hardware) == pytest.approx(
            seconds, rel=1e-12)
