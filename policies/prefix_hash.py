"""What a full KV block is called for prefix caching, the same in every process.

A block's identity is a hash of its tokens chained on the identity of the block before
it, so two requests share a block's name exactly when they share every token up to its
end (vLLM's automatic prefix caching; SGLang's radix tree holds the same information).
Only full blocks have names: a partly filled block still changes.

The hash is BLAKE2b over the parent's digest and the tokens as 64-bit integers, 16
bytes: a client cannot make a prompt collide with another client's blocks (Python's
own `hash` of a tuple could be inverted). The instances name the blocks they fill by it
and the controller names the blocks of the prompts it routes by it, so both agree.
"""
from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

#: The parent of a request's first block.
ROOT = b""
DIGEST_BYTES = 16


def block_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The name of a full block holding `tokens`, after the block named `parent`."""
    return hashlib.blake2b(parent + array("q", tokens).tobytes(),
                           digest_size=DIGEST_BYTES).digest()


def extend_block_hashes(hashes: list[bytes], token_ids: Sequence[int], block_size: int,
                        limit: int | None = None) -> list[bytes]:
    """Append to `hashes` (the names of the first blocks of `token_ids`) the names of the
    rest of its full blocks, at most `limit` blocks in all; returns `hashes`."""
    full = len(token_ids) // block_size
    if limit is not None:
        full = min(full, limit)
    parent = hashes[-1] if hashes else ROOT
    for i in range(len(hashes), full):
        parent = block_hash(parent, token_ids[i * block_size:(i + 1) * block_size])
        hashes.append(parent)
    return hashes


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """The names of every full block of `token_ids`."""
    return extend_block_hashes([], token_ids, block_size)
