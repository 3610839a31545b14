"""Before admission: order the waiting queue, and take out what leaves it this step.

LP instances hand requests that would miss their deadline to an HP instance
(offload); with `drop_expired`, any instance gives up on requests whose TTFT SLO
is lost (drop). The decisions are `policies/` functions; this only applies them,
over the waiting queue's columns: one numpy pass per step, whatever the queue's length
(`policies.queue_columns`). They are the decisions of the per-request reference
functions (`admission.should_drop`, `value.order_by_value`, `offload.plan_offloads`),
to the last bit.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engines.modes import Mode
from engines.ordered_requests import OrderedRequests
from engines.request import Request
from engines.scheduler_config import SchedulerConfig
from engines.waiting_queue import WaitingQueue
from policies.offload import offload_candidates, offload_rows
from policies.predictor import Predictor
from policies.queue_columns import QueueColumns, ttft_lost_rows
from policies.value import get_value_keys, value_order


class Triage:
    def __init__(self, mode: Mode, config: SchedulerConfig, predictor: Predictor) -> None:
        self.mode = mode
        self.config = config
        self.predictor = predictor
        self.value_keys = get_value_keys(mode.value_function or config.value_function)

    @property
    def active(self) -> bool:
        return self.mode.offloads or self.config.drop_expired

    def run(self, waiting: WaitingQueue, now: float, next_batch_time: Callable[[], float],
            ) -> tuple[OrderedRequests, list[Request], list[Request]]:
        """(waiting in admission order, to offload, to drop): the last two have left
        `waiting`. `next_batch_time()`: the predicted seconds until a waiting prompt could
        start; asked only if an offload decision needs it. The first looks requests up as
        it is read (admission reads only its head), until `waiting` next loses one."""
        queue, requests = waiting.columns()
        if self.mode.by_value:
            order = value_order(queue, now, self.value_keys, demote_unreachable=self.mode.demote_unreachable,
                                near=waiting.last_order())
            waiting.remember_order(order)
        else:
            order = np.argsort(queue.position)
        dropped: list[Request] = []
        if self.config.drop_expired:
            lost = ttft_lost_rows(queue, now)
            if lost.any():
                rows = np.flatnonzero(lost)
                dropped = requests[rows[np.argsort(queue.position[rows])]].tolist()
                order = order[~lost[order]]
        going = self._offloads(queue, order, now, next_batch_time) if self.mode.offloads else []
        offloaded = [requests[row] for row in going]
        moved = waiting.remove_many(offloaded + dropped)
        return OrderedRequests(requests, order, set(going), moved), offloaded, dropped

    def _offloads(self, queue: QueueColumns, order: np.ndarray, now: float,
                  next_batch_time: Callable[[], float]) -> list[int]:
        """Rows of `queue` to hand to an HP instance, in value order."""
        budget, config = self.config.chunk_size, self.config
        full_batch = self.predictor.full_batch_time(budget)
        candidates = offload_candidates(queue, order, now, full_batch=full_batch,
                                        threshold=config.offload_threshold,
                                        ipc_delay=config.offload_ipc_delay)
        return offload_rows(queue, order, candidates, now, next_batch_time=next_batch_time,
                            full_batch=full_batch, threshold=config.offload_threshold,
                            ipc_delay=config.offload_ipc_delay)
