"""One request's KV cache out of a paged cache and into another: a P/D hand-off's copy.

Export gathers the request's blocks of every layer into one host buffer per layer --
K then V, shape (2, num_blocks, block_size, num_kv_heads, head_dim), C-contiguous -- and
hands them out as memoryviews over that memory (raw ZeroMQ frames, sent without another
copy); the `KvLayout` header says how to read them. Import checks the frames against
the header and the destination cache, then scatters the first `num_tokens` token slots
into the destination request's blocks, position by position, so the two instances may
even use different block sizes. The cache layout is engines/models/paged_kv.py's.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch

from ipc.messages import KvLayout

KvCaches = Sequence[tuple[torch.Tensor, torch.Tensor]]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def export_blocks(kv_caches: KvCaches, block_table: Sequence[int], num_tokens: int,
                  block_size: int) -> tuple[KvLayout, list[memoryview]]:
    """The header and one frame per layer for the first `num_tokens` tokens of a request
    whose blocks are `block_table`."""
    num_blocks = -(-num_tokens // block_size)
    if num_tokens < 1 or len(block_table) < num_blocks:
        raise ValueError(f"cannot export {num_tokens} tokens from {len(block_table)} blocks")
    key = kv_caches[0][0]
    index = torch.tensor(list(block_table[:num_blocks]), dtype=torch.long, device=key.device)
    frames = []
    for k, v in kv_caches:
        layer = torch.stack((k.index_select(0, index), v.index_select(0, index))).cpu()
        # a uint8 view: numpy has no bfloat16; the array keeps the tensor's memory alive
        frames.append(memoryview(layer.contiguous().view(torch.uint8).numpy()))
    layout = KvLayout(num_layers=len(kv_caches), num_blocks=num_blocks, block_size=block_size,
                      num_kv_heads=key.shape[2], head_dim=key.shape[3],
                      dtype=dtype_name(key.dtype), num_tokens=num_tokens)
    return layout, frames


def import_blocks(kv_caches: KvCaches, block_table: Sequence[int], layout: KvLayout,
                  frames: Sequence, block_size: int) -> None:
    """Write the frames' first `layout.num_tokens` tokens into `block_table`'s slots;
    ValueError (and nothing written) when they do not fit this cache."""
    key = kv_caches[0][0]
    check_frames((len(kv_caches), key.shape[2], key.shape[3]), block_table, layout, frames,
                 block_size)
    source_dtype = getattr(torch, layout.dtype)
    positions = torch.arange(layout.num_tokens)
    table = torch.tensor(list(block_table), dtype=torch.long)
    slots = (table[positions // block_size] * block_size + positions % block_size).to(key.device)
    for (k, v), frame in zip(kv_caches, frames):
        layer = _tensor(frame, source_dtype, layout).to(key.device, key.dtype)
        layer = layer.reshape(2, -1, layout.num_kv_heads, layout.head_dim)[:, :layout.num_tokens]
        k.view(-1, *k.shape[2:]).index_copy_(0, slots, layer[0])
        v.view(-1, *v.shape[2:]).index_copy_(0, slots, layer[1])


def _tensor(frame, dtype: torch.dtype, layout: KvLayout) -> torch.Tensor:
    raw = np.frombuffer(frame, dtype=np.uint8)
    with warnings.catch_warnings():  # a received frame is read-only; it is copied at once
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(raw).view(dtype).reshape(layout.shape)


def check_frames(cache: tuple[int, int, int], block_table: Sequence[int], layout: KvLayout,
                 frames: Sequence, block_size: int) -> None:
    """ValueError unless the frames fit a cache of `cache` = (layers, KV heads, head dim)."""
    if (layout.num_layers, layout.num_kv_heads, layout.head_dim) != tuple(cache):
        raise ValueError(f"KV of {layout.num_layers} layers x {layout.num_kv_heads} heads x "
                         f"{layout.head_dim} does not fit this model's cache "
                         f"({' x '.join(map(str, cache))})")
    dtype = getattr(torch, layout.dtype, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"KV dtype {layout.dtype!r} is not a floating-point torch dtype")
    if layout.num_tokens > layout.num_blocks * layout.block_size:
        raise ValueError(f"KV header claims {layout.num_tokens} tokens in {layout.num_blocks} "
                         f"blocks of {layout.block_size}")
    if len(block_table) * block_size < layout.num_tokens:
        raise ValueError(f"{len(block_table)} blocks cannot hold {layout.num_tokens} tokens")
    expected = 2 * layout.num_blocks * layout.block_size * layout.num_kv_heads * layout.head_dim
    expected *= torch.empty((), dtype=dtype).element_size()
    if len(frames) != layout.num_layers or any(memoryview(f).nbytes != expected for f in frames):
        raise ValueError(f"expected {layout.num_layers} KV frames of {expected} bytes")
