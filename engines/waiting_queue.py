"""The scheduler's waiting requests: a queue with O(1) add and remove anywhere, that keeps
what the policies read of each request in numpy columns (`policies.queue_columns`).

What a policy reads of a waiting request -- its deadline, arrival, priority class,
whether its prefill started, and its predicted prefill time -- does not change while it
waits (a preempted request leaves the running set and comes back as a new entry), so it
is read once, when the request joins. Only the predictions change, when the predictor's
`version` does (a refit): then the whole queue is priced again in one vector call
(`Predictor.prefill_times`), equal to the last bit to asking request by request.

The columns stay packed: row i of every column is the same request, rows 0..n-1 are the
waiting ones, and a removed request's row is filled with the last one's. Queue order is
kept by `position` (counting down at the front), and by the dict of rows.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from engines.request import Request
from policies.predictor import Predictor, remaining_prefill_time
from policies.queue_columns import QueueColumns

_FIRST_CAPACITY = 64
#: (attribute, dtype, its columns) of each block: the columns of one dtype are the rows
#: of one 2-d array (each one contiguous), so moving a row is one operation per block.
#: `_requests` holds the Request of each row.
_BLOCKS = (("_floats", np.float64, ("_own", "_deadline", "_arrival")),
           ("_ints", np.int64, ("_priority", "_position", "_uncomputed", "_computed", "_rank")),
           ("_started", bool, ()), ("_requests", object, ()))


class WaitingQueue:
    def __init__(self, predictor: Predictor, token_budget: int | None) -> None:
        self.predictor = predictor
        self.token_budget = token_budget
        self._rows: dict[Request, int] = {}   # in queue order
        self._back = 0                        # next position at the back ...
        self._front = 0                       # ... and the last one taken at the front
        self._next_rank = 0                   # `_rank` of the next request to join
        self._version = predictor.version
        self._capacity = 0
        self._grow(_FIRST_CAPACITY)

    # ---- a deque's operations -------------------------------------------------------------
    def append(self, request: Request) -> None:
        self._rows[request] = self._fill(request, self._back)
        self._back += 1

    def appendleft(self, request: Request) -> None:
        self._front -= 1
        row = self._fill(request, self._front)
        self._rows = {request: row, **self._rows}

    def remove(self, request: Request) -> None:
        row = self._rows.pop(request, None)
        if row is None:
            raise ValueError(f"{request!r} is not waiting")
        last = len(self._rows)
        if row != last:
            self._move(row, last)
            self._rows[self._requests[row]] = row
        self._requests[last] = None

    def remove_many(self, requests: list[Request]) -> dict[int, int]:
        """`remove` each of `requests` (distinct), the rows moved all at once: the last
        rows still waiting fill the holes the others leave below the new end. Returns
        the rows that moved, old number -> new."""
        if len(requests) < 2:
            moved = {}
            for request in requests:
                row, last = self._rows.get(request), len(self._rows) - 1
                self.remove(request)
                if row != last:
                    moved[last] = row
            return moved
        rows = [self._rows.get(request) for request in requests]
        gone = set(rows)
        if None in gone or len(gone) < len(rows):
            raise ValueError("the requests to remove must be distinct and waiting")
        for request in requests:
            del self._rows[request]
        # The few rows' numbers in plain Python (numpy's per-call cost is most of it here).
        end, old_end = len(self._rows), len(self._rows) + len(rows)
        holes = np.array([row for row in rows if row < end], dtype=np.intp)
        movers = np.array([row for row in range(end, old_end) if row not in gone], dtype=np.intp)
        self._move(holes, movers)
        for row, request in zip(holes.tolist(), self._requests[holes].tolist()):
            self._rows[request] = row
        self._requests[end:old_end] = None
        return dict(zip(movers.tolist(), holes.tolist()))

    def popleft(self) -> Request:
        if not self._rows:
            raise IndexError("pop from an empty waiting queue")
        request = next(iter(self._rows))
        self.remove(request)
        return request

    def __iter__(self) -> Iterator[Request]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, request: object) -> bool:
        return request in self._rows

    # ---- what the policies read -----------------------------------------------------------
    def columns(self) -> tuple[QueueColumns, np.ndarray]:
        """(the columns of every waiting request, those requests), row for row, in no
        particular order (`QueueColumns.position` holds the queue's). Views: valid until
        the queue next changes."""
        self._reprice_if_stale()
        n = len(self._rows)
        columns = QueueColumns(own=self._own[:n], deadline=self._deadline[:n],
                               arrival=self._arrival[:n], priority=self._priority[:n],
                               started=self._started[:n], position=self._position[:n])
        return columns, self._requests[:n]

    def remember_order(self, order: np.ndarray) -> None:
        """Keep `order` (every row, as `columns()` numbers them) for `last_order`."""
        self._rank[order] = np.arange(order.size)
        self._next_rank = order.size

    def last_order(self) -> np.ndarray:
        """Every row, in the order last remembered, those that joined since at the end in
        the order they joined (rows as `columns()` numbers them now): where a sort whose
        keys move little between steps can start from."""
        n = len(self._rows)
        slots = np.full(self._next_rank, -1, dtype=np.intp)
        slots[self._rank[:n]] = np.arange(n)
        return slots[slots >= 0]

    def predicted_seconds(self) -> list[float]:
        """Each waiting request's predicted prefill seconds, in queue order. (The three
        sums here are asked after every step, mostly of an empty queue: answered without
        numpy then.)"""
        if not self._rows:
            return []
        self._reprice_if_stale()
        return self._own[list(self._rows.values())].tolist()

    def uncomputed_tokens(self) -> int:
        """Prompt tokens of all waiting requests not yet computed."""
        n = len(self._rows)
        return int(self._uncomputed[:n].sum()) if n else 0

    def sheddable_uncomputed_tokens(self) -> int:
        """... of those whose priority class is negative (sheddable)."""
        n = len(self._rows)
        return int(self._uncomputed[:n][self._priority[:n] < 0].sum()) if n else 0

    # ---- rows -----------------------------------------------------------------------------
    def _fill(self, request: Request, position: int) -> int:
        row = len(self._rows)
        if row == self._capacity:
            self._grow(2 * self._capacity)
        self._requests[row] = request
        self._position[row] = position
        self._deadline[row] = request.deadline
        self._arrival[row] = request.arrival_time
        self._priority[row] = request.priority
        self._started[row] = request.prefill_started
        self._uncomputed[row] = request.num_uncomputed_tokens
        self._computed[row] = request.num_computed_tokens
        self._rank[row] = self._next_rank
        self._next_rank += 1
        self._own[row] = remaining_prefill_time(request, self.predictor, self.token_budget)
        return row

    def _move(self, to, rows) -> None:
        """Copy row(s) `rows` of every column to `to` (ints, or arrays of them)."""
        for name, _, _ in _BLOCKS:
            block = getattr(self, name)
            block[..., to] = block[..., rows]

    def _grow(self, capacity: int) -> None:
        for name, dtype, columns in _BLOCKS:
            block = np.zeros((len(columns), capacity) if columns else capacity, dtype=dtype)
            if self._capacity:
                block[..., :self._capacity] = getattr(self, name)
            setattr(self, name, block)
            for i, column in enumerate(columns):
                setattr(self, column, block[i])
        self._capacity = capacity

    def _reprice_if_stale(self) -> None:
        """Ask the predictor again about every waiting request if its answers changed."""
        version = self.predictor.version
        if version == self._version:
            return
        self._version = version
        n = len(self._rows)
        if n:
            self._own[:n] = self.predictor.prefill_times(
                self._uncomputed[:n], self._computed[:n], self.token_budget)
