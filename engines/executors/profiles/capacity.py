"""How many tokens of KV cache fit on one GPU next to the model's weights.

As vLLM sizes it: a fraction of the GPU's memory (0.9) minus the bf16 weights, divided
by the KV bytes per token (K and V, every layer, kv_heads x head_dim each: the GQA shape).
Activations are not reserved separately; the 10% left over covers them.
"""
from __future__ import annotations

from policies.model_shape import ModelShape

#: An "80 GB" A100 or H100 reports 80 GiB (81,920 MiB) of device memory.
GPU_MEMORY_BYTES = 80 * 2**30
MEMORY_UTILIZATION = 0.9


def weight_bytes(model: ModelShape) -> int:
    """Decoder layers, the embedding and an untied LM head (norms are negligible)."""
    elements = model.layers * model.layer_weights + 2 * model.vocab * model.hidden
    return elements * model.bytes_per_element


def kv_bytes_per_token(model: ModelShape) -> int:
    return 2 * model.layers * model.kv_size * model.bytes_per_element


def kv_capacity_tokens(model: ModelShape, memory_bytes: int = GPU_MEMORY_BYTES,
                       utilization: float = MEMORY_UTILIZATION) -> int:
    free = utilization * memory_bytes - weight_bytes(model)
    if free <= 0:
        raise ValueError(f"the weights ({weight_bytes(model) / 2**30:.1f} GiB) do not fit in "
                         f"{utilization:.0%} of {memory_bytes / 2**30:.0f} GiB")
    return int(free // kv_bytes_per_token(model))
