"""One engine instance in-process: scheduler + executor, stepped by its caller.

The loop is the one of docs/design.md §3: schedule -> execute -> update, then
feed the step's measured time to the performance model (when the mode uses one).
`generate` runs a set of prompts to completion with continuous batching (offline
use); the instance process calls `step` from its socket loop.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engines.batch import Batch
from engines.executors.base import Executor
from engines.kv_cache import BlockManager
from engines.request import Request
from engines.scheduler import Scheduler
from engines.scheduler_config import SchedulerConfig
from ipc.messages import StepTokens
from ipc.params import SamplingParams
from policies.perf.model import PerfModel
from policies.perf.predictor import MemoPredictor


@dataclass
class Completion:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    finish_reason: str
    num_preemptions: int


@dataclass
class StepResult:
    tokens: StepTokens = field(default_factory=StepTokens)  # the step's, as columns
    offloaded: list[Request] = field(default_factory=list)  # left for an HP instance
    dropped: list[Request] = field(default_factory=list)    # TTFT SLO lost
    seconds: float = 0.0                                     # how long the executor ran


class Engine:
    def __init__(self, executor: Executor, config: SchedulerConfig,
                 clock: Callable[[], float] = time.monotonic,
                 perf_model: PerfModel | None = None) -> None:
        self.executor = executor
        self.kv = BlockManager(executor.num_kv_blocks, executor.block_size,
                                 prefix_caching=config.prefix_caching)
        self.perf_model = perf_model
        self.predictor = MemoPredictor(perf_model) if perf_model is not None else None
        self.scheduler = Scheduler(config, self.kv, executor.max_model_len,
                                   executor.eos_token_ids,
                                   predictor=self.predictor)
        self.clock = clock
        self._ids = itertools.count()

    def add_request(self, prompt_token_ids: list[int], sampling: SamplingParams,
                    request_id: str | None = None, arrival_time: float | None = None,
                    **slo) -> Request:
        """Queue a request; raises ValueError if this instance cannot serve it.

        `arrival_time` defaults to now; the instance process passes the controller's
        (the same monotonic clock), so waiting time counts from arrival at the daemon.
        `slo` may hold `deadline`, `tbt_slo`, `priority`, `pinned`, `generated_before` (see
        Request).
        """
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if arrival_time is None:
            arrival_time = self.clock()
        request = Request(request_id, prompt_token_ids, sampling, arrival_time=arrival_time, **slo)
        self.scheduler.add_request(request)
        return request

    def abort(self, request_id: str) -> bool:
        return self.scheduler.abort(request_id) is not None

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> StepResult:
        """Run one iteration: its new tokens, and the requests that left the queue."""
        batch = self.begin_step(self.clock())
        if not batch:
            return self.finish_step(batch, [], 0.0, self.clock())
        start = self.clock()
        sampled = self.executor.execute(batch)
        end = self.clock()
        return self.finish_step(batch, sampled, end - start, end)

    def begin_step(self, now: float) -> Batch:
        """Decide the next batch (a simulator runs it on its virtual clock in between)."""
        batch = self.scheduler.schedule(now)
        if not batch and self.has_work and not batch.has_events:
            raise RuntimeError(f"scheduler made no progress with {len(self.scheduler.waiting)} "
                               f"waiting and {len(self.scheduler.running)} running requests")
        return batch

    def finish_step(self, batch: Batch, sampled: list[int], seconds: float, now: float,
                    ) -> StepResult:
        """Apply a batch's sampled tokens at `now`; it ran for `seconds`."""
        result = StepResult(offloaded=batch.offloaded, dropped=batch.dropped, seconds=seconds)
        if batch:
            result.tokens = self.scheduler.update(batch, sampled, now)
            self._learn(batch, seconds)
        return result

    def _learn(self, batch: Batch, seconds: float) -> None:
        """Feed the performance model; refit it now and then (and forget stale predictions)."""
        if self.perf_model is None:
            return
        self.perf_model.observe(batch.shape(), seconds)
        if self.perf_model.should_refit():
            self.perf_model.refit()
            self.predictor.clear()

    def generate(self, prompts: Sequence[list[int]], sampling: SamplingParams | Sequence[SamplingParams],
                 ) -> list[Completion]:
        """Run all prompts concurrently to completion; results in prompt order."""
        params = [sampling] * len(prompts) if isinstance(sampling, SamplingParams) else list(sampling)
        requests = [self.add_request(p, s) for p, s in zip(prompts, params, strict=True)]
        while self.has_work:
            self.step()
        return [Completion(r.request_id, r.prompt_token_ids, r.output_token_ids,
                           r.finish_reason.value, r.num_preemptions) for r in requests]
