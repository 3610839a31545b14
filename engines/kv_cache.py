"""Paged KV cache bookkeeping: fixed-size blocks, a free list, per-request block tables.

This only hands out block numbers; the executor owns the tensors they index.
"""
from __future__ import annotations

from collections import deque

from engines.request import Request


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_kv_blocks must be at least 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Share of blocks in use, 0..1."""
        return 1.0 - len(self._free) / self.num_blocks

    def blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        """Blocks `request` must gain so `num_new_tokens` more tokens fit after the cached ones."""
        total = request.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.block_size) - len(request.block_table))

    def can_allocate(self, request: Request, num_new_tokens: int) -> bool:
        return self.blocks_needed(request, num_new_tokens) <= len(self._free)

    def allocate(self, request: Request, num_new_tokens: int) -> bool:
        """Grow the block table for `num_new_tokens` more tokens; False (and no change) if short."""
        need = self.blocks_needed(request, num_new_tokens)
        if need > len(self._free):
            return False
        pop = self._free.popleft
        request.block_table.extend(pop() for _ in range(need))
        return True

    def free(self, request: Request) -> None:
        self._free.extend(request.block_table)
        request.block_table = []
