"""Rotary position embeddings (RoPE), including Llama-3 and linear frequency scaling.

The frequencies are computed exactly as Hugging Face transformers computes them (float32,
same operation order) so that our logits match theirs; cos + i*sin for every position is
tabulated once and each step just indexes the table with its positions. The rotation itself
is a complex multiplication over adjacent dim pairs (see `interleave_order`).
"""
from __future__ import annotations

import math

import torch

from engines.models.model_config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim
    inv_freq = 1.0 / (config.rope_theta ** exponents)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    return _llama3_scale(inv_freq, scaling)


def _llama3_scale(inv_freq: torch.Tensor, scaling) -> torch.Tensor:
    """Llama 3.1: long wavelengths are divided by `factor`, short ones kept, and the band in
    between interpolated smoothly."""
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = ((old_len / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rotation_table(config: ModelConfig, max_positions: int,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """cos + i*sin of every (position, frequency): complex64 [max_positions, head_dim // 2].

    Kept in float32 whatever the model dtype: the complex path (float32) uses it as is,
    the real path casts cos/sin to the model dtype as transformers does."""
    inv_freq = inverse_frequencies(config)
    positions = torch.arange(max_positions, dtype=torch.float)
    freqs = positions[:, None] * inv_freq[None, :]
    return torch.complex(freqs.cos(), freqs.sin()).to(device)


def interleave_order(head_dim: int) -> torch.Tensor:
    """Row order that turns one head's half-split dims (x_i pairs with x_{i+half}, the Hugging
    Face layout) into adjacent pairs (x_i, x_{i+half}) -- the layout `apply_rotary` wants.

    The loader reorders the q and k projection rows of every head this way. Attention only
    sees dot products q.k, which do not change when both are permuted alike; v is untouched."""
    half = head_dim // 2
    return torch.stack((torch.arange(half), torch.arange(half, head_dim)), dim=1).flatten()


def apply_rotary(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """x: [tokens, heads, head_dim] in the interleaved layout; rotation: complex [tokens, 1,
    head_dim // 2] (rows of `rotation_table`). Returns the rotated x, same shape and dtype.

    Each pair (a, b) is the complex number a + ib, and rotating it by the position's angle is
    one complex multiplication: (a cos - b sin) + i(a sin + b cos), the same two sums Hugging
    Face's `x * cos + rotate_half(x) * sin` forms, in one op instead of seven. torch has no
    bfloat16 complex type, so other dtypes take the real form of the same product."""
    pairs = x.unflatten(-1, (-1, 2))
    if x.dtype == torch.float32:
        return torch.view_as_real(torch.view_as_complex(pairs) * rotation).flatten(-2)
    cos = rotation.real.to(x.dtype).unsqueeze(-1)
    sin = rotation.imag.to(x.dtype).unsqueeze(-1)
    swapped = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1)  # (a, b) -> (-b, a)
    return (pairs * cos + swapped * sin).flatten(-2)
