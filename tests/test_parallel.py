"""bench/parallel.py: the one runner of the bench commands' jobs.

Covers: bench/parallel.py.
"""
from __future__ import annotations

import argparse
import os
import time

import pytest

from bench.parallel import (
    add_workers_flag, cores, default_workers, imap, imap_unordered, run_parallel,
)


def _square_and_pid(x: int) -> tuple[int, int]:
    time.sleep(x / 100)     # the larger the job, the later it ends
    return x * x, os.getpid()


def _fails_on_three(x: int) -> int:
    if x == 3:
        raise ValueError(f"job {x} went wrong")
    return x


def test_order_is_the_jobs_order_over_a_pool():
    # later jobs end sooner: a runner that returned results as they finished would
    # scramble them
    results = run_parallel(_square_and_pid, [5, 4, 3, 2, 1, 0], workers=2)
    assert [r for r, _ in results] == [25, 16, 9, 4, 1, 0]
    assert {pid for _, pid in results} != {os.getpid()}    # it did use a pool


def test_one_worker_runs_here_without_a_pool():
    seen = []
    # a lambda does not pickle: it can only run in this process
    assert run_parallel(lambda x: seen.append(x) or x + 1, [1, 2, 3], workers=1) == [2, 3, 4]
    assert seen == [1, 2, 3]
    assert all(pid == os.getpid() for _, pid in run_parallel(_square_and_pid, [7], workers=4))


def test_imap_yields_in_order():
    assert [r for r, _ in imap(_square_and_pid, range(4), workers=1)] == [0, 1, 4, 9]
    assert list(imap(_square_and_pid, [], workers=3)) == []


@pytest.mark.parametrize("workers", [1, 2])
def test_an_exception_in_a_job_propagates_with_its_message(workers):
    with pytest.raises(ValueError, match="job 3 went wrong"):
        run_parallel(_fails_on_three, [1, 2, 3, 4], workers=workers)


def test_the_one_default():
    assert default_workers() == cores() >= 1
    assert default_workers(1) == 1
    assert default_workers(0) == 1
    assert default_workers(10_000) == cores()
    with pytest.raises(ValueError, match="--workers must be >= 1"):
        run_parallel(_square_and_pid, [1], workers=0)


def test_the_flag_defaults_to_the_runners_default():
    parser = argparse.ArgumentParser()
    add_workers_flag(parser)
    assert parser.parse_args([]).workers is None
    assert parser.parse_args(["--workers", "3"]).workers == 3


def test_imap_unordered_yields_each_job_as_it_ends_with_its_index():
    # `plan` prints a line per layout as its search ends: a long first job must not hold
    # back the lines of the short ones after it
    pairs = list(imap_unordered(_square_and_pid, [40, 1, 2], workers=2))
    assert sorted((i, r) for i, (r, _) in pairs) == [(0, 1600), (1, 1), (2, 4)]
    assert pairs[-1][0] == 0  # the long job ends last
    assert list(imap_unordered(_square_and_pid, [3], workers=1))[0][0] == 0
