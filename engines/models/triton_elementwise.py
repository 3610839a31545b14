"""`TritonOps`: the model's element-wise steps as one Triton kernel each (CUDA; see
engines/models/elementwise.py for why and for `TorchOps`, the reference they follow).

Every kernel computes in float32 and rounds to the model dtype where transformers' bf16
ops round.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from engines.models.elementwise import TorchOps

#: Heads one rotary program rotates: small programs, so a one-token step spreads over SMs.
HEADS_PER_PROGRAM = 4


@triton.jit
def _add_rms_norm_kernel(delta_ptr, residual_ptr, weight_ptr, out_ptr, total_ptr, size, eps,
                         stride_delta, stride_residual, stride_out, stride_total,
                         HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < size
    x = tl.load(delta_ptr + row * stride_delta + cols, mask=inside, other=0.0)
    if HAS_RESIDUAL:  # the residual stream's sum, rounded to the model dtype and kept
        residual = tl.load(residual_ptr + row * stride_residual + cols, mask=inside, other=0.0)
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(x.dtype)
        tl.store(total_ptr + row * stride_total + cols, x, mask=inside)
    value = x.to(tl.float32)
    inverse_rms = tl.rsqrt(tl.sum(value * value, 0) / size + eps)
    normed = (value * inverse_rms).to(x.dtype).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (weight * normed).to(x.dtype), mask=inside)


@triton.jit
def _rotate_kernel(x_ptr, positions_ptr, table_ptr, heads, stride_token, stride_head,
                   stride_position, HEAD_DIM: tl.constexpr, HEADS_PER_PROGRAM: tl.constexpr):
    token = tl.program_id(0)
    position = tl.load(positions_ptr + token)
    head = tl.program_id(1) * HEADS_PER_PROGRAM + tl.arange(0, HEADS_PER_PROGRAM)[:, None]
    dims = tl.arange(0, HEAD_DIM)[None, :]
    inside = (head < heads) & (dims < HEAD_DIM)
    rows = x_ptr + token * stride_token + head * stride_head + dims
    x = tl.load(rows, mask=inside, other=0.0)  # whole heads, contiguous
    a, b = tl.split(tl.reshape(x, (HEADS_PER_PROGRAM, HEAD_DIM // 2, 2)))
    half = tl.arange(0, HEAD_DIM // 2)
    angle = table_ptr + position * stride_position + 2 * half  # (cos, sin) pairs, float32
    cos = tl.load(angle).to(x.dtype).to(tl.float32)[None, :]
    sin = tl.load(angle + 1).to(x.dtype).to(tl.float32)[None, :]
    a32, b32 = a.to(tl.float32), b.to(tl.float32)
    rotated = tl.join(a32 * cos - b32 * sin, a32 * sin + b32 * cos)
    tl.store(rows, tl.reshape(rotated, (HEADS_PER_PROGRAM, HEAD_DIM)).to(x.dtype), mask=inside)


@triton.jit
def _silu_and_mul_kernel(gate_up_ptr, out_ptr, size, stride_in, stride_out,
                         BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < size
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=inside, other=0.0)
    up = tl.load(gate_up_ptr + row * stride_in + size + cols, mask=inside, other=0.0)
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (silu * up.to(tl.float32)).to(gate.dtype),
             mask=inside)


class TritonOps:
    name = "triton"

    @staticmethod
    def add_rms_norm(delta: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(RMSNorm(residual + delta), residual + delta); no residual: delta is the sum."""
        tokens, size = delta.shape
        out = torch.empty_like(delta)
        total = delta if residual is None else torch.empty_like(delta)
        if tokens:
            source = delta if residual is None else residual
            block = triton.next_power_of_2(size)
            _add_rms_norm_kernel[(tokens,)](
                delta, source, weight, out, total, size, eps, delta.stride(0), source.stride(0),
                out.stride(0), total.stride(0), HAS_RESIDUAL=residual is not None, BLOCK=block,
                num_warps=min(16, max(1, block // 512)))
        return out, total

    @staticmethod
    def rotation(rope: torch.Tensor, positions: torch.Tensor):
        """What `rotate_qk` takes: the whole table as float32 (cos, sin) pairs, and the
        step's positions (the kernel indexes the table itself)."""
        return torch.view_as_real(rope), positions

    @staticmethod
    def rotate_qk(qk: torch.Tensor, rotation) -> torch.Tensor:
        """RoPE on qk ([tokens, heads, head_dim], pair-interleaved; a view of the qkv
        projection's output) in place; returns qk. A head_dim that is no power of two
        takes the torch formulation."""
        table, positions = rotation
        tokens, heads, head_dim = qk.shape
        if head_dim & (head_dim - 1) or qk.stride(2) != 1:
            rows = torch.view_as_complex(table.index_select(0, positions)).unsqueeze(1)
            return TorchOps.rotate_qk(qk, rows)
        if tokens:
            _rotate_kernel[(tokens, triton.cdiv(heads, HEADS_PER_PROGRAM))](
                qk, positions, table, heads, qk.stride(0), qk.stride(1), table.stride(0),
                HEAD_DIM=head_dim, HEADS_PER_PROGRAM=HEADS_PER_PROGRAM)
        return qk

    @staticmethod
    def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
        tokens, double = gate_up.shape
        size = double // 2
        out = torch.empty((tokens, size), dtype=gate_up.dtype, device=gate_up.device)
        if tokens:
            block = min(1024, triton.next_power_of_2(size))
            _silu_and_mul_kernel[(tokens, triton.cdiv(size, block))](
                gate_up, out, size, gate_up.stride(0), out.stride(0), BLOCK=block)
        return out
