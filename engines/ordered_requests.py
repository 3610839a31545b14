"""Waiting requests in admission order, looked up only as far as they are read.

The triage orders every waiting row each step, but admission usually reads a few
requests from the front (it stops at the first that does not fit, or finds no free
seat). Turning the whole order into requests (or copying the queue's column of them)
touches every waiting request's object, which costs more than the ordering itself;
this looks them up a stretch at a time, as iteration reaches them, skipping the rows
that left the queue.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from engines.request import Request

#: Rows looked up first; each later stretch is this many times the last.
FIRST_STRETCH = 8
GROWTH = 8


class OrderedRequests:
    """`requests[order]`, less the rows in `gone`, as an iterable sequence.

    Rows are numbered as when the queue was ordered; `moved` maps those that a removal
    moved since (`WaitingQueue.remove_many`) to where they are now. `requests` is the
    queue's column of requests, read as iteration goes: valid until the queue next
    removes a request (adding one at the end moves none). Rows are looked up one by one
    in plain Python: for the few that admission reads, numpy's vector calls would cost
    more than they save."""

    def __init__(self, requests: np.ndarray, order: np.ndarray,
                 gone: set[int] | frozenset[int] = frozenset(),
                 moved: dict[int, int] | None = None) -> None:
        self._requests = requests
        self._order = order
        self._gone = gone  # rows in `order` no longer waiting
        self._moved = moved or {}

    def __iter__(self) -> Iterator[Request]:
        start, size, order = 0, FIRST_STRETCH, self._order
        requests, gone, moved = self._requests, self._gone, self._moved
        while start < order.size:
            for row in order[start:start + size].tolist():
                if row not in gone:
                    yield requests[moved.get(row, row)]
            start += size
            size *= GROWTH

    def __len__(self) -> int:
        return int(self._order.size) - len(self._gone)

    def __getitem__(self, index):
        return list(self)[index]
