"""The model's element-wise steps, as torch ops (CPU) or as fused Triton kernels (CUDA).

A decode step at batch 1-64 is a few large matrix products per layer and, between them,
a dozen element-wise ops, each its own kernel of a few microseconds: the residual add, the
RMSNorm's casts and scale, the rotary embedding's casts, products and sums, SiLU and the
gate product. Inside a CUDA graph the launches cost nothing on the host, but each kernel
still occupies the GPU for its minimum duration: on an H100 an 8B decode step ran 939
kernels with these ops and 455 with `TritonOps`, 0.8-1.3 ms less GPU time (docs/gpu.md).
`TritonOps` does each group in one kernel:

* `add_rms_norm`: residual + delta, then RMSNorm of the sum (vLLM's fused_add_rms_norm);
* `rotate_qk`: RoPE on q and k, in place in the fused qkv projection's output;
* `silu_and_mul`: SiLU(gate) * up.

Both classes round where transformers rounds in the model dtype (the residual sum, the
normalised value before its scale, SiLU before the product), so their results differ only
inside float32 (summation order; RoPE's products rounded once rather than three times);
`TorchOps` is the reference the tests hold `TritonOps` to.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engines.models.rotary import apply_rotary


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as transformers computes it: normalised in float32, rounded to the model
    dtype, then scaled by the weight in the model dtype."""
    if x.dtype == torch.float32:  # no casts to make: one call, the weight applied inside
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    normed = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)
    return weight * normed.to(x.dtype)


class TorchOps:
    """The plain torch formulation (CPU, and any device without Triton)."""

    name = "torch"

    @staticmethod
    def add_rms_norm(delta: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(RMSNorm(residual + delta), residual + delta); no residual: delta is the sum."""
        total = delta if residual is None else residual + delta
        return _rms_norm(total, weight, eps), total

    @staticmethod
    def rotation(rope: torch.Tensor, positions: torch.Tensor):
        """What `rotate_qk` takes for the step's positions: their rows of the table."""
        return rope.index_select(0, positions).unsqueeze(1)

    @staticmethod
    def rotate_qk(qk: torch.Tensor, rotation) -> torch.Tensor:
        return apply_rotary(qk, rotation)

    @staticmethod
    def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        # in place: gate_up is ours alone, and two fewer [tokens, intermediate] temporaries
        return F.silu(gate, inplace=True).mul_(up)

