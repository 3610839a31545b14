"""One KV memory pool shared by the models of a multiplexed instance (MuxServe's unified
KV cache), counted in head-wise units.

A *unit* is the K and V of one KV head of one layer for `block_size` tokens (2 x
block_size x head_dim elements). A block of a model -- `block_size` tokens of every
layer and KV head -- is `layers x kv_heads` units (x head_dim / the pool's head_dim,
rounded up, for a model with wider heads), so models of different shapes (depth, GQA
width) draw on one pool: a Llama-3-8B block (32 x 8) costs 256 units, a model with half
its layers half of that. Each model keeps its own `BlockManager` (its own block ids,
tables, prefix cache and reference counts); a block some request holds takes its units
from the pool, and gives them back when no request holds it. A model's *cached free*
blocks (prefix caching) hold no units: they are reused by that model only while the pool
has units for them, and are free to every model otherwise.

What this pool does not do: lay the units out in one device buffer. Each model's
executor keeps its own KV tensors, sized for the most blocks it could ever hold (the
whole pool as its blocks): the pool shares the *budget*; on CUDA a physically shared
buffer would need head-wise paged attention kernels (MuxServe's), which we do not have.
"""
from __future__ import annotations

from math import ceil

from engines.perf.model_shape import ModelShape


class KvPool:
    def __init__(self, num_units: int) -> None:
        if num_units < 1:
            raise ValueError(f"a KV pool needs at least one unit, got {num_units}")
        self.num_units = num_units
        self.used_units = 0
        #: Units each model's held blocks take, by model name (for /health and metrics).
        self.used_by: dict[str, int] = {}

    @property
    def free_units(self) -> int:
        return self.num_units - self.used_units

    def take(self, model: str, units: int) -> None:
        """`units` more held by `model` (the caller checked they are free)."""
        self.used_units += units
        self.used_by[model] = self.used_by.get(model, 0) + units

    def give_back(self, model: str, units: int) -> None:
        self.used_units -= units
        self.used_by[model] -= units


def block_units(shape: ModelShape, unit_head_dim: int) -> int:
    """Units one block of a model of `shape` takes in a pool of `unit_head_dim` heads."""
    return shape.layers * shape.kv_heads * ceil(shape.head_dim / unit_head_dim)


def unit_bytes(block_size: int, head_dim: int, bytes_per_element: int) -> int:
    """Bytes of one unit: K and V of one head, one layer, `block_size` tokens."""
    return 2 * block_size * head_dim * bytes_per_element
