"""An instance's steps, one record a step (`instances.step_log`): what each batch was and
how long the executor took to run it, in the live process, for comparing a live run's
steps with a profile's or with another run's at the same batch composition
(bench/profiling/step_log_study.py).

Off by default; when off the instance runs `engines/timed_step.py`'s step and this file
costs nothing. On, each step is timed as there, plus the thread's CPU time over the
executor's call (how much of the step's wall time the instance held its core), and one
`StepRecord` is written as a JSON line (buffered; the file is closed when the instance
exits).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from engines.executors.base import Executor
from engines.instance_core import InstanceCore, Output


class StepRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One step of a live instance. Times are seconds of the instance's clock."""

    start: float                       # when begin_step was called
    core_s: float                      # begin_step: the scheduler's turn
    execute_s: float                   # the executor's call, wall time
    cpu_s: float                       # this thread's CPU time over that call
    finish_s: float                    # finish_step
    prefills: list[tuple[int, int]]    # (tokens, cached before them) per prefill chunk
    decodes: list[int]                 # each decode's context, its own token included


class StepLog:
    """Runs and times an instance's steps, writing a `StepRecord` for each to `path`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "wb")  # noqa: SIM115 -- open for the instance's life
        self._encoder = msgspec.json.Encoder()

    def timed_step(self, core: InstanceCore, executor: Executor,
                   clock: Callable[[], float]) -> list[Output]:
        """`engines.timed_step.timed_step`, recorded."""
        start = clock()
        batch, outputs = core.begin_step(start)
        if not batch:
            return outputs
        began, cpu = clock(), time.thread_time()
        sampled = executor.execute(batch)
        end, cpu = clock(), time.thread_time() - cpu
        outputs = core.finish_step(batch, sampled, end - start, end)
        shape = batch.shape()   # a Batch's, or a multiplexed step's (MuxBatch)
        self._file.write(self._encoder.encode(StepRecord(
            start=start, core_s=began - start, execute_s=end - began, cpu_s=cpu,
            finish_s=clock() - end, prefills=list(shape.prefills),
            decodes=list(shape.decodes))) + b"\n")
        return outputs

    def close(self) -> None:
        self._file.close()


#: A gap this long after a step means the instance waited for work: its turn ends there.
IDLE_GAP_S = 1e-3


def turns(records: list[StepRecord]) -> list[float]:
    """Each step's whole turn, seconds: the scheduler, the executor, the outputs sent and
    the commands taken -- to the next step's start, or to its own end when the instance
    then waited `IDLE_GAP_S` or more (the last step: to its end)."""
    ends = [r.start + r.core_s + r.execute_s + r.finish_s for r in records]
    nexts = [r.start for r in records[1:]] + [float("inf")]
    return [(after if after - end < IDLE_GAP_S else end) - r.start
            for r, end, after in zip(records, ends, nexts)]


def read_step_log(path: str | Path) -> list[StepRecord]:
    """The records of a step log; ValueError naming the file and the line when one is not
    a record."""
    decoder = msgspec.json.Decoder(StepRecord)
    records = []
    for number, line in enumerate(Path(path).read_bytes().splitlines(), 1):
        if line.strip():
            try:
                records.append(decoder.decode(line))
            except msgspec.DecodeError as exc:
                raise ValueError(f"step log {str(path)!r} line {number}: {exc}") from None
    return records
