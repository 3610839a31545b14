"""Our RoPE (pair-interleaved dims, one complex multiplication in float32, the real form of
the same product otherwise) equals Hugging Face's `x * cos + rotate_half(x) * sin` on the
half-split layout, once both are put in the same dim order.

Covers: engines/models/rotary.py.
"""
from __future__ import annotations

import pytest
import torch

from engines.models.model_config import ModelConfig
from engines.models.rotary import apply_rotary, interleave_order, rotation_table
from engines.models.tiny import tiny_config


def hf_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rotation_matches_hugging_face_formula(dtype):
    config = ModelConfig.from_dict(tiny_config("llama"))
    table = rotation_table(config, 300)
    positions = torch.tensor([0, 1, 17, 255, 299])
    torch.manual_seed(0)
    x = torch.randn(len(positions), 3, config.head_dim).to(dtype)
    angles = table[positions][:, None, :]
    cos = torch.cat((angles.real, angles.real), dim=-1).to(dtype)  # HF's cos/sin tables
    sin = torch.cat((angles.imag, angles.imag), dim=-1).to(dtype)
    order = interleave_order(config.head_dim)
    expected = hf_rotary(x, cos, sin)[..., order]
    got = apply_rotary(x[..., order], angles)
    assert got.dtype == dtype and got.shape == x.shape
    if dtype == torch.float32:  # the complex product may round its sums differently
        assert torch.allclose(got, expected, atol=1e-6)
    else:  # the real form does HF's operations in HF's order
        assert torch.equal(got, expected)


def test_interleave_order_pairs_each_dim_with_its_partner_half_a_head_away():
    assert interleave_order(8).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
