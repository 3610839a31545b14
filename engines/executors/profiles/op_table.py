"""Vidur's per-layer operator times (linear, norm, activation ops) as a function of the
number of tokens in the batch, read from one `vidur/*_mlp.csv` file or the packaged table
derived from it (data.py says which; both are read by the same code).

Times are medians at one tensor-parallel degree (1, 2, 4 or 8: one rank's share of the
layer), in seconds per transformer layer (the `emb` column: per model). Between measured token counts the time is interpolated
linearly (the grid is dense: 1, 2, 4, 8, then steps of 8 up to 1024, doubling the
step at every power of two above: 16 up to 2048, 32 up to 4096, ...);
beyond the largest measured count it grows in proportion to the tokens, which is how
GEMM time scales once the GPU is saturated.
"""
from __future__ import annotations

import csv
import gzip
from dataclasses import dataclass, field
import os
from functools import lru_cache
from pathlib import Path

import numpy as np

from engines.executors.profiles.data import ENV_VAR, op_file

#: The 9 per-layer ops the README's "sum of the 9 per-layer ops" table adds up.
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
             "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
#: The four of them that are GEMMs (fused QKV, O, fused gate+up, down).
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
#: The layer shape columns _gemm_weights reads.
SHAPE_COLUMNS = ("n_embd", "n_head", "n_kv_head", "n_expanded_embd", "use_gated_mlp")
#: Every column this module reads (a derived table holds these, in this order).
TP_COLUMN = "num_tensor_parallel_workers"
COLUMNS = ("num_tokens", *(f"time_stats.{op}.median" for op in ("emb", *LAYER_OPS)),
           *SHAPE_COLUMNS, TP_COLUMN)


@dataclass(frozen=True)
class OpTable:
    """Measured token counts and, per count, seconds of the 9 ops / the 4 GEMMs / emb."""
    source: str
    tokens: np.ndarray
    layer_s: np.ndarray
    gemm_s: np.ndarray
    emb_s: np.ndarray
    #: elements of the four GEMMs' weights for the file's layer shape (the LM head is
    #: scaled from these: same K = hidden, so time ~ output width)
    gemm_weights: int

    #: Interpolated values by (column, token count): a simulator asks for the same few
    #: thousand counts every step, and one numpy interpolation costs microseconds.
    memo: dict[tuple[str, float], float] = field(default_factory=dict, compare=False,
                                                 repr=False)

    def layer(self, num_tokens: float) -> float:
        """Seconds of one layer's 9 ops for a batch of `num_tokens` tokens."""
        return self._value("layer_s", num_tokens)

    def gemm(self, num_tokens: float) -> float:
        return self._value("gemm_s", num_tokens)

    def emb(self, num_tokens: float) -> float:
        return self._value("emb_s", num_tokens)

    def _value(self, column: str, num_tokens: float) -> float:
        key = (column, num_tokens)
        value = self.memo.get(key)
        if value is None:
            value = self.memo[key] = _interpolate(self.tokens, getattr(self, column), num_tokens)
        return value


def _interpolate(grid: np.ndarray, values: np.ndarray, x: float) -> float:
    """Piecewise linear through the measured points; proportional to x past the last one."""
    if x <= 0:
        return 0.0
    if x > grid[-1]:
        return float(values[-1] * x / grid[-1])
    return float(np.interp(x, grid, values))


def _median(row: dict[str, str], op: str) -> float:
    return float(row[f"time_stats.{op}.median"]) * 1e-3  # ms -> s


def _gemm_weights(row: dict[str, str]) -> int:
    """q/k/v/o and gated-MLP weight elements of one layer, from the file's shape columns."""
    hidden, heads = int(row["n_embd"]), int(row["n_head"])
    kv = int(row["n_kv_head"]) * (hidden // heads)
    mlp = int(row["n_expanded_embd"])
    gated = row["use_gated_mlp"].strip().lower() == "true"
    return hidden * (2 * hidden + 2 * kv) + (3 if gated else 2) * hidden * mlp


def read_rows(path: Path, tp: int | None = 1) -> list[dict[str, str]]:
    """The rows op tables are built from, one per token count in ascending order: those at
    tensor-parallel degree `tp` (None: every degree, one per (degree, count), by degree).
    A few token counts appear twice in the raw files (rows within 3% of each other); the
    later row wins, as in the README's summary table."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as f:
        rows = [r for r in csv.DictReader(f)
                if tp is None or int(r.get(TP_COLUMN, "1")) == tp]
    if not rows:
        raise ValueError(f"{path}: no rows at tensor-parallel degree {tp}")
    by_key = {(int(r.get(TP_COLUMN, "1")), int(r["num_tokens"])): r for r in rows}
    return [by_key[k] for k in sorted(by_key)]


@lru_cache(maxsize=None)
def _load(path: Path, tp: int = 1) -> OpTable:
    picked = read_rows(path, tp)
    grid = [int(r["num_tokens"]) for r in picked]

    def column(ops) -> np.ndarray:
        arr = np.array([sum(_median(r, op) for op in ops) for r in picked])
        arr.flags.writeable = False
        return arr

    tokens = np.array(grid, dtype=np.float64)
    tokens.flags.writeable = False
    return OpTable(source=path.name, tokens=tokens, layer_s=column(LAYER_OPS),
                   gemm_s=column(GEMM_OPS), emb_s=column(("emb",)),
                   gemm_weights=_gemm_weights(picked[0]))


def load_op_table(filename: str, tp: int = 1) -> OpTable:
    """The table of Vidur's `filename` at tensor-parallel degree `tp`, parsed once per
    process (per data folder): a profile asks on every step, so the file is not looked up
    again each time."""
    return _table_for(filename, os.environ.get(ENV_VAR), tp)


@lru_cache(maxsize=None)
def _table_for(filename: str, data_folder: str | None, tp: int = 1) -> OpTable:
    return load_op_table_at(op_file(filename), tp)


def load_op_table_at(path: Path, tp: int = 1) -> OpTable:
    """The table in the file at `path`: a raw Vidur file or a derived `.csv.gz` table."""
    return _load(Path(path).resolve(), tp)
