"""Before admission: order the waiting queue, and take out what leaves it this step.

LP instances hand requests that would miss their deadline to an HP instance
(offload); with `drop_expired`, any instance gives up on requests whose TTFT SLO
is lost (drop). The decisions are `policies/` functions; this only applies them.
"""
from __future__ import annotations

from collections.abc import Sequence

from engines.modes import Mode
from engines.request import Request
from engines.scheduler_config import SchedulerConfig
from policies.admission import should_drop
from policies.offload import plan_offloads
from policies.predictor import Predictor
from policies.value import get_value_function, order_by_value


class Triage:
    def __init__(self, mode: Mode, config: SchedulerConfig, predictor: Predictor) -> None:
        self.mode = mode
        self.config = config
        self.predictor = predictor
        self.value_fn = get_value_function(mode.value_function or config.value_function)

    @property
    def active(self) -> bool:
        return self.mode.offloads or self.config.drop_expired

    def run(self, waiting: Sequence[Request], now: float, next_batch_time: float,
            ) -> tuple[list[Request], list[Request], list[Request]]:
        """(waiting in admission order, to offload, to drop)."""
        budget = self.config.chunk_size
        dropped = [r for r in waiting if should_drop(r, now, predictor=self.predictor,
                                                     token_budget=budget,
                                                     drop_expired=self.config.drop_expired)]
        gone = set(map(id, dropped))
        staying = [r for r in waiting if id(r) not in gone]
        if self.mode.by_value:
            staying = order_by_value(staying, now, self.value_fn, self.predictor, budget,
                                     demote_lost=self.mode.demote_lost)
        offloaded: list[Request] = []
        if self.mode.offloads:
            offloaded, _hopeless = plan_offloads(
                staying, now, predictor=self.predictor, token_budget=budget,
                next_batch_time=next_batch_time, threshold=self.config.offload_threshold,
                ipc_delay=self.config.offload_ipc_delay)
            if offloaded:
                leaving = set(map(id, offloaded))
                staying = [r for r in staying if id(r) not in leaving]
        return staying, offloaded, dropped
