"""The paged KV cache layout the attention backends share, and its index arithmetic.

The KV cache of one layer is two tensors `[num_blocks, block_size, num_kv_heads, head_dim]`
(flash-attn's paged layout); position p of a sequence lives in block `block_table[p //
block_size]`, slot `p % block_size`. A step's sequences are `SeqSpec`s: the new tokens of
a sequence sit at positions start .. start+num_tokens-1 and attend to every position up to
their own.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class SeqSpec(NamedTuple):
    start: int              # tokens of this sequence already in the cache
    num_tokens: int         # new tokens in this step
    block_table: list[int]  # KV blocks of the sequence, in position order


def slot_mapping(seqs: list[SeqSpec], block_size: int) -> list[int]:
    """The flat cache slot of every new token, in batch order."""
    slots: list[int] = []
    for start, n, table in seqs:
        for p in range(start, start + n):
            slots.append(table[p // block_size] * block_size + p % block_size)
    return slots


def padded_tables(seqs: list[SeqSpec], num_blocks: int) -> torch.Tensor:
    """[len(seqs), num_blocks] block ids; a short table is padded with block 0."""
    width = max(1, num_blocks)
    rows = [list(s.block_table[:width]) for s in seqs]
    return torch.tensor([row + [0] * (width - len(row)) for row in rows], dtype=torch.long)


def context_slots(seqs: list[SeqSpec], block_size: int, length: int) -> torch.Tensor:
    """[len(seqs), length] flat cache slots of positions 0..length-1 of each sequence
    (past a sequence's end the slots are junk but valid, and masked out by the caller)."""
    tables = padded_tables(seqs, -(-length // block_size))
    offsets = torch.arange(block_size)
    return (tables[:, :, None] * block_size + offsets).flatten(1)[:, :length]


def gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rows of the flattened cache: [*slots.shape, kv_heads, head_dim]."""
    flat = cache.view(-1, *cache.shape[2:])
    return flat.index_select(0, slots.reshape(-1)).view(*slots.shape, *cache.shape[2:])


def write_cache(k, v, k_cache, v_cache, slots: torch.Tensor) -> None:
    """Store the step's new K/V ([tokens, kv_heads, head_dim]) at their flat slots."""
    k_cache.view(-1, *k.shape[1:]).index_copy_(0, slots, k)
    v_cache.view(-1, *v.shape[1:]).index_copy_(0, slots, v)
