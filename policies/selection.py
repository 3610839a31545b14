"""Out-of-order prefill selection (the paper's Algorithm 1), over an already-ordered list.

Walk the candidates most urgent first and take each while every budget still
covers its cost:

* tokens  -- its remaining prompt; when chunked, cut to what is left of the token
  budget (so only the last one taken can be a cut chunk: after it the budget is 0);
* KV      -- the blocks those tokens need beyond its block table, counted exactly
  as `engines.kv_cache.BlockManager.blocks_needed` does;
* seats   -- one, if it holds no blocks yet (it would start occupying the batch);
* compute -- the predicted seconds of its chunk.

Stop at the first candidate that does not fit, even if a later one would: skipping
ahead would let short requests starve an urgent long one. A cost equal to what is
left fits (the scheduler may fill its budget exactly).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from policies.predictor import Predictor


class Candidate(Protocol):
    """The part of a waiting request selection reads."""

    @property
    def num_computed_tokens(self) -> int: ...
    @property
    def num_uncomputed_tokens(self) -> int: ...
    @property
    def block_table(self) -> list[int]: ...


def blocks_needed(request: Candidate, num_new_tokens: int, block_size: int) -> int:
    """Blocks `request` must gain so `num_new_tokens` more tokens fit after its cached ones."""
    total = request.num_computed_tokens + num_new_tokens
    return max(0, -(-total // block_size) - len(request.block_table))


def select_prefills(ordered: Iterable[Candidate], *, token_budget: int, free_blocks: int,
                    block_size: int, seat_limit: int, compute_budget: float,
                    predictor: Predictor, chunked: bool = True) -> list[tuple[Candidate, int]]:
    """(request, tokens to prefill this step) for the prefix of `ordered` that fits.

    `token_budget`: tokens left in this step; `free_blocks`: free KV blocks;
    `seat_limit`: how many more requests may start holding KV blocks (e.g.
    max_num_seqs − running); `compute_budget`: predicted seconds left in this step
    (`math.inf` for none).
    """
    selected: list[tuple[Candidate, int]] = []
    tokens, blocks, seats, compute = token_budget, free_blocks, seat_limit, compute_budget
    for request in ordered:
        if tokens <= 0:
            break
        n = request.num_uncomputed_tokens
        if n > tokens:
            if not chunked:
                break
            n = tokens
        need_blocks = blocks_needed(request, n, block_size)
        need_seat = 0 if request.block_table else 1
        seconds = predictor.prefill_time(n, request.num_computed_tokens)
        if need_blocks > blocks or need_seat > seats or seconds > compute:
            break
        selected.append((request, n))
        tokens -= n
        blocks -= need_blocks
        seats -= need_seat
        compute -= seconds
    return selected
