"""Non-negative least squares for a handful of columns, in plain numpy.

The optimum of min ||A x - b|| subject to x >= 0 is the ordinary least-squares solution
on its own support: its fitted vector is a non-negative combination of some linearly
independent columns, and the residual is orthogonal to them. So solving every subset of
linearly independent columns and keeping the best one whose solution is all >= 0 is
exact. That is 2^n small solves: a few milliseconds for the performance model's five
features, and no SciPy dependency. Ties (collinear features fit the data equally well)
go to the smallest subset, so the answer is deterministic.
"""
from __future__ import annotations

from itertools import combinations

import numpy as np

MAX_COLUMNS = 10


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x >= 0 minimising ||a @ x - b||; a is [rows, columns] with few columns."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    rows, cols = a.shape
    if cols > MAX_COLUMNS:
        raise ValueError(f"exhaustive NNLS is for at most {MAX_COLUMNS} columns, got {cols}")
    norms = np.linalg.norm(a, axis=0)
    live = [j for j in range(cols) if norms[j] > 0]
    scaled = a / np.where(norms > 0, norms, 1.0)  # equal column norms: better conditioning
    best_x, best_cost = np.zeros(cols), float(b @ b)
    for size in range(1, min(len(live), rows) + 1):
        for subset in combinations(live, size):
            x, cost = _solve(scaled, b, list(subset))
            if x is not None and cost < best_cost * (1 - 1e-9) - 1e-300:
                best_x, best_cost = x, cost
    return best_x / np.where(norms > 0, norms, 1.0)


def _solve(a: np.ndarray, b: np.ndarray, subset: list[int]):
    """Least squares on the columns in `subset`: (x over all columns, squared residual), or
    (None, inf) when those columns are dependent or the solution has a negative entry."""
    sub = a[:, subset]
    coef, _, rank, _ = np.linalg.lstsq(sub, b, rcond=None)
    if rank < len(subset) or coef.min() < 0:
        return None, np.inf
    residual = b - sub @ coef
    x = np.zeros(a.shape[1])
    x[subset] = coef
    return x, float(residual @ residual)
