"""A waiting queue as columns: what the per-step policies read of each waiting request,
one numpy array per field, one element per request.

Value order, drops and offloads ask the same few questions of every waiting request at
every engine step; asked one request at a time in Python that is most of a step with a
long queue. Their vector forms (`value.value_order`, `offload.offload_rows`,
`ttft_lost_rows` here) answer over these arrays at once, and decide exactly as the
per-request functions they mirror: the same floating-point operations in the same order
(tests compare them on random queues).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from policies.predictor import Predictor, remaining_prefill_time
from policies.request_view import WaitingRequest


@dataclass(frozen=True, slots=True)
class QueueColumns:
    own: np.ndarray        # float64: remaining_prefill_time(request, predictor, token_budget)
    deadline: np.ndarray   # float64: absolute TTFT deadline
    arrival: np.ndarray    # float64
    priority: np.ndarray   # int64: higher class first
    started: np.ndarray    # bool: prefill_started (or pinned)
    position: np.ndarray   # int64: place in the queue; requests equal on every key keep it

    def __len__(self) -> int:
        return self.own.size

    @classmethod
    def of(cls, requests: Sequence[WaitingRequest], predictor: Predictor,
           token_budget: int | None) -> "QueueColumns":
        """Columns of `requests`, in this order (a policy's list argument, as an array)."""
        return cls(
            own=np.array([remaining_prefill_time(r, predictor, token_budget) for r in requests],
                         dtype=np.float64),
            deadline=np.array([r.deadline for r in requests], dtype=np.float64),
            arrival=np.array([r.arrival_time for r in requests], dtype=np.float64),
            priority=np.array([r.priority for r in requests], dtype=np.int64),
            started=np.array([r.prefill_started for r in requests], dtype=bool),
            position=np.arange(len(requests), dtype=np.int64))


def ttft_lost_rows(columns: QueueColumns, now: float) -> np.ndarray:
    """bool per request: `admission.ttft_unreachable` -- not started, and even started now on an
    idle instance its prefill would end after its deadline."""
    return ~columns.started & (now + columns.own > columns.deadline)
