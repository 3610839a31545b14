"""Which prompt positions each instance of an ESP group computes (torch-free: the
instance core and the controller count stripes without loading the model).

Striped, not split in blocks: rank r of k takes positions r, r + k, r + 2k, ..., so under a
causal mask every rank's (query, key) pairs are the same to within one row, where
contiguous blocks would give the last rank k times the first one's work."""
from __future__ import annotations


def stripe(num_tokens: int, size: int, rank: int) -> range:
    """The positions of a `num_tokens` prompt whose queries rank `rank` of `size` computes."""
    return range(rank, num_tokens, size)


def stripe_len(num_tokens: int, size: int, rank: int) -> int:
    """len(stripe(...)): the tokens whose KV rank `rank` keeps."""
    return len(stripe(num_tokens, size, rank))
