"""The fused Triton element-wise kernels (engines/models/triton_elementwise.py) against the
torch ops the model runs on CPU.

On a CUDA machine natively in bf16 and fp16; here through Triton's interpreter (float32
and fp16: the interpreter has no bfloat16), the same kernel code.

Covers: engines/models/triton_elementwise.py.
"""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined
pytest.importorskip("triton")

from engines.models.elementwise import TorchOps  # noqa: E402
from engines.models.loader import select_ops  # noqa: E402
from engines.models.model_config import ModelConfig  # noqa: E402
from engines.models.rotary import rotation_table  # noqa: E402
from engines.models.tiny import tiny_config  # noqa: E402
from engines.models.triton_elementwise import TritonOps  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = ([torch.bfloat16, torch.float16] if DEVICE.type == "cuda"
          else [torch.float32, torch.float16])


def tolerance(dtype) -> float:
    """float32: summation order only; 16-bit: one rounding step of the dtype."""
    return {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]


def close(got, expected, dtype) -> bool:
    return torch.allclose(got.float(), expected.float(), rtol=tolerance(dtype),
                          atol=tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_is_the_residual_sum_and_its_norm(dtype, with_residual):
    torch.manual_seed(1)
    delta = torch.randn(5, 96, dtype=dtype, device=DEVICE)
    residual = torch.randn_like(delta) if with_residual else None
    weight = torch.rand(96, dtype=dtype, device=DEVICE) + 0.5
    out, total = TritonOps.add_rms_norm(delta, residual, weight, 1e-5)
    expected_out, expected_total = TorchOps.add_rms_norm(delta, residual, weight, 1e-5)
    assert close(total, expected_total, dtype)
    assert close(out, expected_out, dtype)
    if not with_residual:
        assert total is delta  # nothing to add: the stream is the input itself


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotate_qk_rotates_the_qk_columns_in_place_and_leaves_v(dtype):
    """q (4 heads) and k (2 heads) rotated inside the fused projection's rows, as the
    model calls it; v's columns untouched."""
    config = ModelConfig.from_dict(tiny_config("llama"))
    table = rotation_table(config, 64, DEVICE)
    torch.manual_seed(2)
    tokens, head_dim = 7, config.head_dim
    qkv = torch.randn(tokens, (4 + 2 + 2) * head_dim, dtype=dtype, device=DEVICE)
    positions = torch.tensor([0, 3, 9, 63, 1, 1, 40], device=DEVICE)
    qk_size = 6 * head_dim

    def qk_view(x):
        return x[:, :qk_size].view(tokens, -1, head_dim)

    expected = TorchOps.rotate_qk(qk_view(qkv.clone()), TorchOps.rotation(table, positions))
    fused = qkv.clone()
    got = TritonOps.rotate_qk(qk_view(fused), TritonOps.rotation(table, positions))
    assert got.data_ptr() == fused.data_ptr()
    assert close(qk_view(fused), expected, dtype)
    assert torch.equal(fused[:, qk_size:], qkv[:, qk_size:])


def test_a_head_dim_that_is_no_power_of_two_is_rotated_too():
    """The kernel wants power-of-two heads; others take the torch formulation."""
    table = rotation_table(ModelConfig.from_dict(tiny_config("llama")), 16, DEVICE)[:, :12]
    positions = torch.tensor([2, 5, 15], device=DEVICE)
    qk = torch.randn(3, 3, 24, device=DEVICE)
    expected = TorchOps.rotate_qk(qk.clone(), TorchOps.rotation(table, positions))
    got = TritonOps.rotate_qk(qk, TritonOps.rotation(table.contiguous(), positions))
    assert torch.allclose(got, expected, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_over_more_columns_than_one_program_holds(dtype):
    torch.manual_seed(3)
    gate_up = torch.randn(3, 2 * 1500, dtype=dtype, device=DEVICE)
    got = TritonOps.silu_and_mul(gate_up)
    expected = TorchOps.silu_and_mul(gate_up.clone())
    assert got.shape == (3, 1500)
    assert close(got, expected, dtype)


def test_an_empty_step_launches_nothing():
    empty = torch.empty(0, 32, device=DEVICE)
    out, total = TritonOps.add_rms_norm(empty, empty, torch.ones(32, device=DEVICE), 1e-5)
    assert out.shape == total.shape == (0, 32)
    assert TritonOps.silu_and_mul(empty).shape == (0, 16)


def test_the_fused_kernels_serve_cuda_in_16_bit_only():
    assert select_ops(torch.device("cpu"), torch.float32) is TorchOps
    assert select_ops(torch.device("cuda"), torch.float32) is TorchOps
    assert select_ops(torch.device("cuda"), torch.bfloat16) is TritonOps
