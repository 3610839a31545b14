"""Out-of-order prefill selection (the paper's Algorithm 1; docs/design.md §5.3), over an already-ordered list.

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

from collections.abc import Callable, Iterable
from policies.predictor import Predictor
from policies.request_view import WaitingRequest


def blocks_needed(request: WaitingRequest, num_new_tokens: int, block_size: int) -> int:
    """Blocks `request` must gain so `num_new_tokens` more tokens fit after its cached ones."""
    total = request.num_computed_tokens + num_new_tokens
    return max(0, -(-total // block_size) - len(request.block_table))


def select_prefills(ordered: Iterable[WaitingRequest], *, token_budget: int, free_blocks: int,
                    block_size: int, seat_limit: int, compute_budget: float,
                    predictor: Predictor, chunked: bool = True,
                    cut_to_compute: bool = False,
                    count_blocks: Callable[[WaitingRequest, int], int] | None = None,
                    ) -> list[tuple[WaitingRequest, int]]:
    """(request, tokens to prefill this step) for the prefix of `ordered` that fits.

    `token_budget`: tokens left in this step; `free_blocks`: free KV blocks;
    `seat_limit`: how many more requests may start holding KV blocks (e.g.
    max_num_seqs − running); `compute_budget`: predicted seconds left in this step
    (`math.inf` for none). `cut_to_compute` (chunked only): a candidate whose chunk
    would outlast the compute budget is cut to what fits it (at least one KV block's
    worth of tokens) and is the last one taken, instead of stopping selection -- else a
    token budget larger than the compute budget allows would never admit a long prompt.
    `count_blocks(request, tokens)`: the free blocks a candidate takes (default:
    `blocks_needed`; the scheduler passes its KV cache's, which counts a prefix-cache hit).
    """
    if count_blocks is None:
        def count_blocks(request: WaitingRequest, n: int) -> int:
            return blocks_needed(request, n, block_size)
    selected: list[tuple[WaitingRequest, int]] = []
    tokens, blocks, seats, compute = token_budget, free_blocks, seat_limit, compute_budget
    for request in ordered:
        if tokens <= 0:
            break
        n = request.num_uncomputed_tokens
        if n > tokens:
            if not chunked:
                break
            n = tokens
        seconds = predictor.prefill_time(n, request.num_computed_tokens)
        last = False
        if seconds > compute and chunked and cut_to_compute:
            n = tokens_within(request, n, compute, predictor, min_chunk=block_size)
            if n == 0:
                break
            seconds = predictor.prefill_time(n, request.num_computed_tokens)
            last = True  # the compute budget is spent: this cut chunk is the last one
        need_blocks = count_blocks(request, n)
        need_seat = 0 if request.block_table else 1
        if need_blocks > blocks or need_seat > seats or seconds > compute:
            break
        selected.append((request, n))
        tokens -= n
        blocks -= need_blocks
        seats -= need_seat
        compute -= seconds
        if last:
            break
    return selected


def tokens_within(request: WaitingRequest, n: int, seconds: float, predictor: Predictor,
                   min_chunk: int) -> int:
    """The most of `n` tokens (at least `min_chunk`) whose predicted prefill fits in
    `seconds`; 0 if not even `min_chunk` does. Bisection: prefill time grows with tokens."""
    already = request.num_computed_tokens
    floor = min(min_chunk, n - 1)
    if floor < 1 or predictor.prefill_time(floor, already) > seconds:
        return 0
    lo, hi = floor, n - 1  # n itself does not fit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if predictor.prefill_time(mid, already) <= seconds:
            lo = mid
        else:
            hi = mid - 1
    return lo
