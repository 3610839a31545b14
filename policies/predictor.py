"""What the policies need from a performance model, and two small implementations.

The policies never import the performance model itself: they depend on this
protocol, so any model (the fitted one in engines/perf/model.py, a profile, a stub)
plugs in. `MemoPredictor` lets a caller that asks the same questions every engine
step (value ordering, offload planning) pay for each distinct question once.

A caller that keeps answers (the scheduler's waiting queue keeps each waiting prompt's
predicted prefill time) asks again, all at once with `prefill_times`, when `version`
changes: a predictor's answers change only with its version (a refit).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from policies.batch_shape import BatchShape
from policies.request_view import WaitingRequest


class Predictor(Protocol):
    def prefill_time(self, num_tokens: int, already: int = 0,
                     token_budget: int | None = None) -> float:
        """Predicted seconds to prefill `num_tokens` more prompt tokens after `already`
        cached ones; with `token_budget`, run as chunks of that budget, one per step
        (the sum of those steps)."""
        ...

    def prefill_times(self, num_tokens: np.ndarray, already: np.ndarray,
                      token_budget: int | None = None) -> np.ndarray:
        """`prefill_time` of many requests at once; element i is exactly
        `prefill_time(num_tokens[i], already[i], token_budget)`."""
        ...

    @property
    def version(self) -> int:
        """Changes whenever any answer may have changed (a refit); answers asked at the
        same version are the same."""
        ...

    def full_batch_time(self, token_budget: int) -> float:
        """Predicted seconds of one full-token-budget prefill batch (the worst-case HP batch)."""
        ...

    def batch_time(self, shape: BatchShape) -> float:
        """Predicted seconds of one step running `shape` (prefill chunks and decodes)."""
        ...


class ZeroPredictor:
    """Everything is free: for modes that make no time-based decisions (sarathi, vllm)."""

    version = 0

    def prefill_time(self, num_tokens: int, already: int = 0,
                     token_budget: int | None = None) -> float:
        return 0.0

    def prefill_times(self, num_tokens: np.ndarray, already: np.ndarray,
                      token_budget: int | None = None) -> np.ndarray:
        return np.zeros(np.shape(num_tokens))

    def full_batch_time(self, token_budget: int) -> float:
        return 0.0

    def batch_time(self, shape: BatchShape) -> float:
        return 0.0


def remaining_prefill_time(request: WaitingRequest, predictor: Predictor,
                           token_budget: int | None) -> float:
    """Predicted seconds to compute what is left of `request`'s prompt, chunked by the budget."""
    return predictor.prefill_time(request.num_uncomputed_tokens, request.num_computed_tokens,
                                  token_budget)


@dataclass(frozen=True)
class LinearPredictor:
    """Each step costs `fixed` seconds plus `seconds_per_token` per token. For tests and benches."""

    seconds_per_token: float
    fixed: float = 0.0
    version = 0

    def prefill_time(self, num_tokens: int, already: int = 0,
                     token_budget: int | None = None) -> float:
        if num_tokens <= 0:
            return 0.0
        steps = 1 if token_budget is None else math.ceil(num_tokens / token_budget)
        return steps * self.fixed + num_tokens * self.seconds_per_token

    def prefill_times(self, num_tokens: np.ndarray, already: np.ndarray,
                      token_budget: int | None = None) -> np.ndarray:
        tokens = np.asarray(num_tokens, dtype=np.int64)
        steps = (np.ones(tokens.shape) if token_budget is None
                 else np.ceil(tokens / token_budget))
        seconds = steps * self.fixed + tokens * self.seconds_per_token
        return np.where(tokens > 0, seconds, 0.0)

    def full_batch_time(self, token_budget: int) -> float:
        return self.fixed + token_budget * self.seconds_per_token

    def batch_time(self, shape: BatchShape) -> float:
        return self.fixed + shape.num_tokens * self.seconds_per_token if shape.num_tokens else 0.0


class MemoPredictor:
    """Remembers another predictor's answers, keyed by the question's arguments.

    Waiting requests ask the same question every step (their prompts do not change
    while they wait), so a costly model is asked once per distinct prompt length.
    The owner (one engine loop) keeps it; call `clear()` whenever the wrapped model
    is refitted, or its answers go stale. Bounded: it forgets everything past
    `max_entries`. Its `version` is the wrapped model's (cleared on every refit, its
    answers are the wrapped model's answers).
    """

    def __init__(self, predictor: Predictor, max_entries: int = 65_536) -> None:
        self.predictor = predictor
        self.max_entries = max_entries
        self._prefill: dict[tuple[int, int, int | None], float] = {}
        self._full: dict[int, float] = {}

    @property
    def version(self) -> int:
        return self.predictor.version

    def prefill_times(self, num_tokens: np.ndarray, already: np.ndarray,
                      token_budget: int | None = None) -> np.ndarray:
        """Not remembered: asked of the wrapped model in one call (its answers are the
        ones remembered, as long as the owner clears this on every refit)."""
        return self.predictor.prefill_times(num_tokens, already, token_budget)

    def prefill_time(self, num_tokens: int, already: int = 0,
                     token_budget: int | None = None) -> float:
        key = (num_tokens, already, token_budget)
        seconds = self._prefill.get(key)
        if seconds is None:
            if len(self._prefill) >= self.max_entries:
                self._prefill.clear()
            seconds = self._prefill[key] = self.predictor.prefill_time(
                num_tokens, already, token_budget)
        return seconds

    def full_batch_time(self, token_budget: int) -> float:
        seconds = self._full.get(token_budget)
        if seconds is None:
            seconds = self._full[token_budget] = self.predictor.full_batch_time(token_budget)
        return seconds

    def batch_time(self, shape: BatchShape) -> float:
        """Not remembered: a step's composition rarely repeats."""
        return self.predictor.batch_time(shape)

    def clear(self) -> None:
        self._prefill.clear()
        self._full.clear()
