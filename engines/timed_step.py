"""The step of a turn on a real executor, timed: the one place an instance's drivers that
run one (the instance process, offline generation) measure how long a step took.

The core decides the batch; the executor runs it; the driver's clock says how long it
ran, which the core reports (`StepOutputs.step_seconds`) and teaches its performance
model. The simulator has no such step: a batch lasts what its executor predicts.
"""
from __future__ import annotations

from collections.abc import Callable

from engines.executors.base import Executor
from engines.instance_core import InstanceCore, Output


def timed_step(core: InstanceCore, executor: Executor, clock: Callable[[], float],
               ) -> list[Output]:
    """Begin the core's step, run its batch on `executor`, finish it; the core's outputs
    (an empty batch runs nothing: the turn ends at once)."""
    start = clock()
    batch, outputs = core.begin_step(start)
    if not batch:
        return outputs
    return run_timed(core, executor, clock, batch, start)


def run_timed(core: InstanceCore, executor: Executor, clock: Callable[[], float], batch,
              start: float) -> list[Output]:
    """Run the non-empty `batch` the core began at `start` on `executor`, finish it."""
    sampled = executor.execute(batch)
    end = clock()
    return core.finish_step(batch, sampled, end - start, end)
