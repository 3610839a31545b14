"""SGLang's admission by reserved output (docs/baselines.md, "SGLang"): pure arithmetic.

Before a new request is admitted, free KV must cover, besides its prompt, the output it
may still write: all of its own (up to a clip), and for each running request its
remaining output times the *new-token ratio* -- the share of `max_tokens` requests are
expected to actually use. The ratio starts at 0.7, falls by a small step every decode
step while nothing goes wrong (memory turns out to be plentiful), and is raised again
when a decode step runs out of memory and requests must be retracted: to the share the
remaining requests have used so far, plus a margin of 20 tokens each.

Not modelled: SGLang's per-step cap on prefill input (16,384 tokens; our mode's chunk
size bounds a step instead) and its pause after a failed memory test until the running
set shrinks.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

INIT_RATIO = 0.7
MIN_RATIO = 0.098          # 0.7 x 0.14 (SGLang's min_new_token_ratio factor)
RATIO_DECAY = (INIT_RATIO - MIN_RATIO) / 600  # reaches the floor after ~600 decode steps
#: The most output one new request reserves for itself (SGLang's clip).
CLIP_MAX_NEW_TOKENS = 4096
#: Tokens per retained request added to the ratio after a retraction.
RETRACT_MARGIN_TOKENS = 20


def decayed(ratio: float) -> float:
    """The ratio after one more decode step without a retraction."""
    return max(MIN_RATIO, ratio - RATIO_DECAY)


def new_request_reserve(max_tokens: int) -> int:
    """Output tokens a request reserves when it is admitted."""
    return min(max_tokens, CLIP_MAX_NEW_TOKENS)


def running_reserve_tokens(remaining: Iterable[int], ratio: float) -> int:
    """Output tokens reserved for running requests with `remaining` tokens left each
    (each clipped as a new request's own reserve is)."""
    return math.ceil(sum(min(max(0, r), CLIP_MAX_NEW_TOKENS) for r in remaining) * ratio)


def ratio_after_retraction(generated: Iterable[int], max_tokens: Iterable[int]) -> float:
    """The ratio once a retraction leaves requests that have generated `generated` of
    their `max_tokens`: what they used so far, plus a margin, at most 1."""
    generated, max_tokens = list(generated), list(max_tokens)
    wanted = sum(max_tokens)
    if not wanted:
        return INIT_RATIO
    return min(1.0, (sum(generated) + RETRACT_MARGIN_TOKENS * len(generated)) / wanted)
