"""Offline generation: the instance core's third driver, in-process, with no controller.

`ascendra generate` (daemon/generate_cmd.py) and the tests that run prompts to the end
hold an `Offline`: an instance core over a real executor, handed `Submit`s as the
controller would hand them (the same checks: a prompt the instance cannot serve is
refused), stepped turn after turn (engines/timed_step.py) until nothing is left. With no
controller to hear them, the core's messages go back to the caller of `step`; the tokens
are read off each request as they come. `generate` runs a set of prompts to completion
with continuous batching.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engines.executors.base import Executor
from engines.instance_core import InstanceCore, Output
from engines.modes import role_of_mode
from engines.request import Request
from engines.scheduler_config import SchedulerConfig
from engines.timed_step import timed_step
from ipc.messages import RequestError, Submit
from ipc.params import SamplingParams
from engines.perf.model import PerfModel


@dataclass
class Completion:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    finish_reason: str
    num_preemptions: int


class Offline:
    def __init__(self, executor: Executor, config: SchedulerConfig,
                 clock: Callable[[], float] = time.monotonic,
                 perf_model: PerfModel | None = None, core=None) -> None:
        """`core`: an instance core over `executor` built elsewhere (a multiplexed one,
        engines/mux_core.py, over its MuxExecutor); None: an InstanceCore of `config`."""
        self.executor = executor
        self.core = core if core is not None else InstanceCore(
            0, role_of_mode(config.mode), executor, config, perf_model)
        self.clock = clock
        self._ids = itertools.count()

    def add_request(self, prompt_token_ids: list[int], sampling: SamplingParams,
                    request_id: str | None = None, **submit) -> Request:
        """Hand the core a Submit (`submit`: its other fields, `arrival_time` now by
        default); the request it queued. ValueError if the core refuses it."""
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        submit.setdefault("arrival_time", self.clock())
        message = Submit(request_id=request_id, prompt_token_ids=list(prompt_token_ids),
                         sampling=sampling, **submit)
        for output in self.core.handle(message, message.arrival_time):
            if isinstance(output, RequestError):
                raise ValueError(output.message)
        return self.core.find_request(request_id)

    def step(self) -> list[Output]:
        """One turn of the core: its batch run and timed; its messages (tokens, offloads,
        drops: what the instance process would send)."""
        return timed_step(self.core, self.executor, self.clock)

    def generate(self, prompts: Sequence[list[int]],
                 sampling: SamplingParams | Sequence[SamplingParams]) -> list[Completion]:
        """Run all prompts concurrently to completion; results in prompt order."""
        params = ([sampling] * len(prompts) if isinstance(sampling, SamplingParams)
                  else list(sampling))
        requests = [self.add_request(p, s) for p, s in zip(prompts, params, strict=True)]
        while self.core.has_work:
            self.step()
        return [Completion(r.request_id, r.prompt_token_ids, r.output_token_ids,
                           r.finish_reason.value, r.num_preemptions) for r in requests]
