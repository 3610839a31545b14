"""Independent jobs (simulations, capacity searches) over a pool of processes: the one
runner every bench command and study uses, and the one default of how many processes.

* `default_workers(num_jobs)`: a process per core this process may run on, at most one
  per job -- the default of every command's `--workers` (`add_workers_flag`);
* `imap(fn, jobs, workers)`: the results in job order, each as soon as it and those
  before it are done (for progress lines);
* `imap_unordered(fn, jobs, workers)`: (index, result) pairs as each job finishes;
* `run_parallel(fn, jobs, workers)`: all the results, in job order.

With one worker (asked for, or one job) the jobs run here, one after the other, with no
pool: simpler to debug, and faster for tests. Otherwise `fn` and every job must pickle
(a top-level function). A job's exception is raised by the runner with its own type and
message, and the jobs not yet started are cancelled.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import TypeVar

J = TypeVar("J")
R = TypeVar("R")

WORKERS_HELP = "parallel processes (default: one per core, at most one per job; 1: no pool)"


def cores() -> int:
    """The cores this process may run on (its affinity mask, where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_workers(num_jobs: int | None = None) -> int:
    """One process per core, at most one per job (never fewer than one)."""
    n = cores() if num_jobs is None else min(cores(), num_jobs)
    return max(1, n)


def add_workers_flag(parser: argparse.ArgumentParser) -> None:
    """`--workers N`; unset (None), the runner takes `default_workers`."""
    parser.add_argument("--workers", type=int, default=None, help=WORKERS_HELP)


def imap(fn: Callable[[J], R], jobs: Iterable[J], workers: int | None = None) -> Iterator[R]:
    """`fn(job)` for every job, yielded in job order; over `workers` processes (default
    `default_workers(len(jobs))`, never more than there are jobs)."""
    jobs = list(jobs)
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    n = default_workers(len(jobs)) if workers is None else min(workers, max(1, len(jobs)))
    if n == 1:
        for job in jobs:
            yield fn(job)
        return
    pool = ProcessPoolExecutor(max_workers=n)
    try:
        futures = [pool.submit(fn, job) for job in jobs]
        last = futures.pop()
        for future in futures:
            yield future.result()
        result = last.result()
        pool.shutdown()  # gone before the last result, however far the consumer reads
        yield result
    finally:  # an error, or a consumer that stopped early: start nothing more
        pool.shutdown(wait=True, cancel_futures=True)


def imap_unordered(fn: Callable[[J], R], jobs: Iterable[J],
                   workers: int | None = None) -> Iterator[tuple[int, R]]:
    """(index, `fn(job)`) for every job, each as soon as it is done (for a progress line
    per job while the others still run); over processes as `imap`."""
    jobs = list(jobs)
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    n = default_workers(len(jobs)) if workers is None else min(workers, max(1, len(jobs)))
    if n == 1:
        for i, job in enumerate(jobs):
            yield i, fn(job)
        return
    pool = ProcessPoolExecutor(max_workers=n)
    try:
        index = {pool.submit(fn, job): i for i, job in enumerate(jobs)}
        for future in as_completed(index):
            yield index[future], future.result()
    finally:  # an error, or a consumer that stopped early: start nothing more
        pool.shutdown(wait=True, cancel_futures=True)


def run_parallel(fn: Callable[[J], R], jobs: Iterable[J],
                 workers: int | None = None) -> list[R]:
    """`[fn(job) for job in jobs]`, over `workers` processes (see `imap`)."""
    return list(imap(fn, jobs, workers))
