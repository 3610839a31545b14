"""What an instance lets in, and what it gives up on (docs/design.md §5.5, §5.7, §5.8).

* Tickets (§5.5): an idle HP asks for the next new request; at most one open
  ticket per HP, so an urgent offload that arrives meanwhile waits one batch at most.
* Elastic batch (§5.7): HP admits prefills while the free KV left afterwards still
  covers what its running decodes are predicted to need, from the observed decode
  lengths; LP does the same and also caps its batch at `LP_MAX_BATCH`.
* Drops (§5.8): under overload, give up on a waiting request once its TTFT SLO is
  lost -- missed, or out of reach even if it started now on an idle instance.
"""
from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Iterable

import numpy as np

from policies.predictor import Predictor, remaining_prefill_time
from policies.request_view import RunningRequest, WaitingRequest

#: The paper's LP batch is a fixed 128; on ShareGPT (long outputs) that cap filled up and
#: left prompts waiting with budget to spare: at 10 QPS on 2L1H (simulated)
#: 256 cut LP scheduling delay from ~1 s to ~0.4 s and raised goodput, with no preemption.
LP_MAX_BATCH = 256
#: The batch limit an HP's ticket rule measures against: its KV-bound (elastic) batch can
#: grow far larger, but it asks for new work only while it runs under half of this,
#: so that it stays quick for the offloads it exists to serve (the authors' 128).
TICKET_BATCH_LIMIT = 128
#: An HP asks for a ticket only below this share of its batch limit ...
TICKET_MAX_BATCH_SHARE = 0.5
#: ... and with more than this share of its KV blocks free (the authors' settings).
TICKET_MIN_FREE_KV = 0.10


# ---- tickets ---------------------------------------------------------------------------
def ticket_wanted(num_waiting: int, num_running: int, max_batch: int, free_kv_fraction: float,
                  has_open_ticket: bool) -> bool:
    """Should this HP send a ticket: nothing waiting, room in its batch and KV, none open."""
    return (num_waiting == 0 and not has_open_ticket
            and num_running < TICKET_MAX_BATCH_SHARE * max_batch
            and free_kv_fraction > TICKET_MIN_FREE_KV)


class TicketBook:
    """The controller's open tickets: at most one per HP, handed out oldest first. No I/O."""

    def __init__(self) -> None:
        self._open: dict[int, None] = {}  # insertion-ordered set of HP ids

    def open(self, hp: int) -> bool:
        """Record a ticket from `hp`; False if it already has one open (the new one is void)."""
        if hp in self._open:
            return False
        self._open[hp] = None
        return True

    def take(self) -> int | None:
        """The HP whose ticket a new request uses (the ticket closes), or None if none is open."""
        if not self._open:
            return None
        hp = next(iter(self._open))
        del self._open[hp]
        return hp

    def cancel(self, hp: int) -> None:
        """Close `hp`'s ticket, if any (it got an offload, or it went away)."""
        self._open.pop(hp, None)

    def is_open(self, hp: int) -> bool:
        return hp in self._open

    def __len__(self) -> int:
        return len(self._open)


# ---- elastic batch ---------------------------------------------------------------------
class DecodeLengthHistory:
    """The output lengths of the last `window` finished requests, to predict running ones.

    A running request that has generated g tokens is expected to end at the mean of
    the observed lengths above g. With no such observation (no data yet, or it has
    outlived them all) the estimate falls back to its max_tokens: conservative.
    """

    def __init__(self, window: int = 1000) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self._recent: deque[int] = deque(maxlen=window)
        self._sorted: list[int] = []
        self._suffix_sums: list[int] | None = None  # rebuilt lazily after changes
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None  # the same, for numpy

    def observe(self, output_tokens: int) -> None:
        if len(self._recent) == self._recent.maxlen:
            oldest = self._recent[0]
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
        self._recent.append(output_tokens)
        bisect.insort(self._sorted, output_tokens)
        self._suffix_sums = None
        self._arrays = None

    def __len__(self) -> int:
        return len(self._recent)

    def expected_remaining(self, generated_so_far: int, max_tokens: int) -> float:
        """Expected further output tokens of a request that has generated `generated_so_far`."""
        cap = max(0, max_tokens - generated_so_far)
        i = bisect.bisect_right(self._sorted, generated_so_far)
        longer = len(self._sorted) - i
        if longer == 0:
            return float(cap)
        mean_length = self._suffix_sum(i) / longer
        return min(float(cap), mean_length - generated_so_far)

    def _suffix_sum(self, i: int) -> int:
        if self._suffix_sums is None:
            totals = list(itertools.accumulate(reversed(self._sorted), initial=0))
            self._suffix_sums = totals[::-1]
        return self._suffix_sums[i]

    def expected_remaining_array(self, generated: np.ndarray, max_tokens: np.ndarray,
                                 ) -> np.ndarray | None:
        """`expected_remaining` of each (generated, max_tokens) pair (int64 arrays), the same
        floats: the quotient of the same two integers, both exact as float64, is the same
        correctly rounded number. None if the sums are too large to be exact."""
        if self._arrays is None:
            if sum(self._sorted) >= 2**53:  # `_suffix_sum(0)`; below it every sum is exact
                return None
            # the suffix sums of `_suffix_sum`, by numpy (they change with every finish)
            ordered = np.array(self._sorted, dtype=np.int64)
            suffix_sums = np.zeros(ordered.size + 1, dtype=np.int64)
            suffix_sums[:-1] = np.cumsum(ordered[::-1])[::-1]
            self._arrays = (ordered, suffix_sums)
        ordered, suffix_sums = self._arrays
        cap = np.maximum(max_tokens - generated, 0).astype(np.float64)
        i = np.searchsorted(ordered, generated, side="right")
        longer = ordered.size - i
        mean_length = suffix_sums[i] / np.maximum(longer, 1)  # where longer == 0, unused
        return np.where(longer > 0, np.minimum(cap, mean_length - generated), cap)


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def decode_reserve(running_decodes: Iterable[RunningRequest], history: DecodeLengthHistory,
                   block_size: int) -> int:
    """KV blocks the running requests are predicted to still need to finish their outputs."""
    reserve = 0
    for request in running_decodes:
        more = history.expected_remaining(request.num_output_tokens, request.sampling.max_tokens)
        final = blocks_for(request.num_tokens + math.ceil(more), block_size)
        reserve += max(0, final - len(request.block_table))
    return reserve


def decode_reserve_columns(num_tokens: np.ndarray, generated: np.ndarray, max_tokens: np.ndarray,
                           held_blocks: np.ndarray, history: DecodeLengthHistory,
                           block_size: int) -> int | None:
    """`decode_reserve` over columns, one element per running decode (its tokens, output
    tokens, max_tokens and blocks held, int64): the same sum, in a few vector operations
    instead of a Python loop (an elastic step asks it over every decode). None (ask
    `decode_reserve`) where float64 would not hold the numbers exactly."""
    if max_tokens.size and max_tokens.max() >= 2**52:
        return None  # past float64's integers
    more = history.expected_remaining_array(generated, max_tokens)
    if more is None:
        return None
    final = -(-(num_tokens + np.ceil(more).astype(np.int64)) // block_size)
    return int(np.maximum(final - held_blocks, 0).sum())


# ---- drops -----------------------------------------------------------------------------
def ttft_unreachable(request: WaitingRequest, now: float, predictor: Predictor, token_budget: int | None,
              ) -> bool:
    """Its TTFT SLO is out of reach: even started now on an idle instance, its prefill ends
    after the deadline (or the deadline has passed). Never for a request whose prefill
    started (or was preempted): it holds, or held, the instance's work."""
    if request.prefill_started:
        return False
    return now + remaining_prefill_time(request, predictor, token_budget) > request.deadline


def should_drop(request: WaitingRequest, now: float, *, predictor: Predictor, token_budget: int,
                drop_expired: bool) -> bool:
    """Give up on a waiting request: `drop_expired` is on and its TTFT SLO is lost
    (`ttft_unreachable`). The engine names the reason (`FinishReason.DROP`)."""
    return drop_expired and ttft_unreachable(request, now, predictor, token_budget)
