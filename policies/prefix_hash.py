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

import functools
import hashlib
import struct
from array import array
from collections.abc import Callable, Sequence

#: The parent of a request's first block.
ROOT = b""
DIGEST_BYTES = 16
#: Bytes of one token as hashed: a 64-bit integer in native order (array("q")'s layout).
TOKEN_BYTES = 8
#: Prompts whose names `block_hashes` keeps at hand (least recently named forgotten).
NAMED_PROMPTS = 256


def block_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The name of a full block holding `tokens`, after the block named `parent`."""
    return hashlib.blake2b(parent + array("q", tokens).tobytes(),
                           digest_size=DIGEST_BYTES).digest()


def token_bytes(tokens: Sequence[int]) -> bytes:
    """`tokens` as `block_hash` hashes them: `array("q", tokens).tobytes()`, packed by
    struct in a third of the time (OverflowError past 64 bits, as array raises)."""
    try:
        return struct.pack(f"{len(tokens)}q", *tokens)
    except struct.error as exc:
        raise OverflowError(str(exc)) from None


#: A hash of nothing yet, copied for each block (cheaper than making one with its
#: parameters: the same state, so the same digests).
_EMPTY = hashlib.blake2b(digest_size=DIGEST_BYTES)
#: `struct.Struct(f"{n}q").pack` by n (a block's: one size per block size).
_PACKERS: dict[int, Callable[..., bytes]] = {}


def chained_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """`block_hash(parent, tokens)` of one full block, its tokens packed by struct."""
    pack = _PACKERS.get(len(tokens))
    if pack is None:
        pack = _PACKERS[len(tokens)] = struct.Struct(f"{len(tokens)}q").pack
    try:
        data = pack(*tokens)
    except struct.error as exc:
        raise OverflowError(str(exc)) from None
    hasher = _EMPTY.copy()
    hasher.update(parent + data)
    return hasher.digest()


def _chain(parent: bytes, data: bytes, block_size: int) -> list[bytes]:
    """`block_hash` of each block of `data` (whole blocks of `token_bytes`), chained on
    `parent`: one conversion of the tokens to bytes, not one per block."""
    step, empty, names = block_size * TOKEN_BYTES, _EMPTY.copy, []
    for start in range(0, len(data), step):
        hasher = empty()
        hasher.update(parent + data[start:start + step])
        parent = hasher.digest()
        names.append(parent)
    return names


def extend_block_hashes(hashes: list[bytes], token_ids: Sequence[int], block_size: int,
                        limit: int | None = None) -> list[bytes]:
    """Append to `hashes` (the names of the first blocks of `token_ids`) the names of the
    rest of its full blocks, at most `limit` blocks in all; returns `hashes`."""
    full = len(token_ids) // block_size
    if limit is not None:
        full = min(full, limit)
    done = len(hashes)
    if done < full:
        data = token_bytes(token_ids[done * block_size:full * block_size])
        hashes += _chain(hashes[-1] if hashes else ROOT, data, block_size)
    return hashes


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """The names of every full block of `token_ids`.

    A prompt is named where it arrives (the controller), again where it is sent (an
    instance) and again where it may be offloaded (an HP): the names of the last
    `NAMED_PROMPTS` token sequences are kept, by content, so in one process -- the
    simulator runs them all in one -- a prompt is hashed once."""
    full = len(token_ids) // block_size
    return list(_named(token_bytes(token_ids[:full * block_size]), block_size))


@functools.lru_cache(maxsize=NAMED_PROMPTS)
def _named(data: bytes, block_size: int) -> tuple[bytes, ...]:
    return tuple(_chain(ROOT, data, block_size))
