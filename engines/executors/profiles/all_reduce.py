"""Vidur's all-reduce times (NCCL, one node): what a tensor-parallel layer's two
all-reduces cost, as a function of the bytes reduced and the number of GPUs.

Read from Vidur's `network/<gpu>_dgx/all_reduce.csv` (copied as `vidur/<gpu>_dgx_all_reduce.csv`)
or the packaged table derived from it (data.py says which). The rows used are those of one
node (`devices_per_node == num_workers`), the median time of rank 0; `size` is in bytes
(fp16: 2 bytes per element, as Vidur's own predictor reads it: a step of n tokens reduces
n x hidden x 2 bytes). Between measured sizes the time is interpolated linearly; past the
largest it grows in proportion to the bytes (bandwidth-bound).
"""
from __future__ import annotations

import csv
import gzip
import io
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from engines.executors.profiles.data import ENV_VAR, op_file

#: The columns a derived table holds, in this order.
COLUMNS = ("num_workers", "size", "time_stats.all_reduce.median")


def read_rows(path: Path) -> list[dict[str, str]]:
    """One node's rank-0 rows, by (workers, size); a size measured twice: the later row."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as f:
        rows = [r for r in csv.DictReader(f)
                if r.get("rank", "0") == "0" and r.get("collective", "all_reduce") == "all_reduce"
                and r.get("devices_per_node", r["num_workers"]) == r["num_workers"]]
    by_key = {(int(r["num_workers"]), int(r["size"])): r for r in rows}
    return [by_key[k] for k in sorted(by_key)]


def derived_csv(raw_file: Path) -> bytes:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows([row[c] for c in COLUMNS] for row in read_rows(raw_file))
    return text.getvalue().encode()


@dataclass(frozen=True)
class AllReduceTable:
    source: str
    #: workers -> (sizes in bytes, seconds), ascending sizes
    curves: dict[int, tuple[np.ndarray, np.ndarray]]
    memo: dict[tuple[int, int], float] = field(default_factory=dict, compare=False, repr=False)

    def seconds(self, workers: int, num_bytes: int) -> float:
        """One all-reduce of `num_bytes` over `workers` GPUs (0 for one GPU)."""
        if workers <= 1 or num_bytes <= 0:
            return 0.0
        key = (workers, num_bytes)
        value = self.memo.get(key)
        if value is None:
            if workers not in self.curves:
                raise ValueError(f"{self.source}: no all-reduce times for {workers} GPUs "
                                 f"(measured: {sorted(self.curves)})")
            sizes, times = self.curves[workers]
            if num_bytes > sizes[-1]:
                value = float(times[-1] * num_bytes / sizes[-1])
            else:
                value = float(np.interp(num_bytes, sizes, times))
            self.memo[key] = value
        return value


@lru_cache(maxsize=None)
def _load(path: Path) -> AllReduceTable:
    curves: dict[int, list[tuple[int, float]]] = {}
    for row in read_rows(path):
        curves.setdefault(int(row["num_workers"]), []).append(
            (int(row["size"]), float(row["time_stats.all_reduce.median"]) * 1e-3))
    return AllReduceTable(path.name, {w: (np.array([s for s, _ in points], dtype=np.float64),
                                          np.array([t for _, t in points]))
                                      for w, points in curves.items()})


def load_all_reduce(filename: str) -> AllReduceTable:
    """The all-reduce table of Vidur's `filename`, parsed once per process (per folder)."""
    return _table_for(filename, os.environ.get(ENV_VAR))


@lru_cache(maxsize=None)
def _table_for(filename: str, data_folder: str | None) -> AllReduceTable:
    return _load(op_file(filename).resolve())
