"""How long a batch takes: roofline features and an online non-negative regression (docs/design.md §5.1).

    t = C1 (t_M + t_F) + C2 max(t_M, t_F) + C3 t_M + C4 t_F + C5

t_M and t_F come from `perf_features`; C1..C5 are fitted by non-negative least squares on
(batch, measured seconds) pairs the engine feeds in while it serves. Before any fit the
coefficients are the pure roofline (C2 = 1) plus a small fixed overhead.

Two choices the paper leaves open:
* the fit minimises *relative* error (each row is divided by its measured time), since a
  5 ms decode step and a 500 ms prefill matter alike to the schedulers, and MAPE is what
  is reported;
* every `holdout_every`-th observation is kept out of the fit, so `mape` is measured on
  data the coefficients never saw. A refit keeps the old coefficients when they do better
  on that held-out data (a cached fit is not thrown away for a worse one).

C1 (t_M + t_F) equals C1 t_M + C1 t_F, so only C1+C3, C1+C4, C2 and C5 are pinned down by
data; NNLS then prefers the fewest non-zero coefficients.

Prefill predictions are linear in the coefficients: a prompt's chunks sum to one row of
five features, and its time is that row times C1..C5. The schedulers ask for the same
prompts every step, so the rows are remembered per question and outlive a refit (only
the five products are redone); `version` changes whenever the coefficients do, for
callers that keep predictions of their own. Scalar (`prefill_time`) and vector
(`prefill_times`) answers are equal to the last bit: both sum the same rows in the same
order and weigh them term by term in the same order.
"""
from __future__ import annotations

import itertools
import math
import operator
from collections import deque
from dataclasses import asdict

import numpy as np

from engines.perf.features import prefill_bytes_and_flops, times
from engines.perf.hardware_spec import HardwareSpec
from engines.perf.model_shape import ModelShape
from engines.perf.nnls import nnls
from policies.batch_shape import BatchShape

__all__ = ["COEFFICIENT_NAMES", "DEFAULT_COEFFICIENTS", "PerfModel", "feature_rows"]

COEFFICIENT_NAMES = ("C1_sum", "C2_max", "C3_memory", "C4_compute", "C5_constant")
#: Prefill questions whose feature rows are remembered (forgotten all at once past this).
MAX_REMEMBERED_ROWS = 65_536
#: the roofline, plus 1 ms for launching a step
DEFAULT_COEFFICIENTS = (0.0, 1.0, 0.0, 0.0, 1e-3)


def feature_rows(t_m, t_f) -> np.ndarray:
    """[..., 5] regression features of (t_M, t_F) arrays, in the order C1..C5 multiply."""
    t_m, t_f = np.broadcast_arrays(np.asarray(t_m, np.float64), np.asarray(t_f, np.float64))
    return np.stack([t_m + t_f, np.maximum(t_m, t_f), t_m, t_f, np.ones_like(t_m)], axis=-1)


def _samples_array(samples: deque[tuple[float, float, float]]) -> np.ndarray:
    """[n, 3] float64 of (t_M, t_F, seconds) samples: `np.array` on a deque of tuples, but
    read as one flat run of floats (a refit's conversion of 1,600 samples, 2x faster)."""
    flat = itertools.chain.from_iterable(samples)
    return np.fromiter(flat, np.float64, 3 * len(samples)).reshape(-1, 3)


def _mape(coeffs: np.ndarray, rows: np.ndarray, seconds: np.ndarray) -> float:
    return float(np.mean(np.abs(rows @ coeffs - seconds) / seconds))


class PerfModel:
    def __init__(self, model: ModelShape, hw: HardwareSpec, coeffs=None, *,
                 window: int = 2000, holdout_every: int = 5, refit_every: int = 200,
                 min_fit_samples: int = 10) -> None:
        if holdout_every < 2:
            raise ValueError("holdout_every must be >= 2 (some samples must train)")
        self.model, self.hw = model, hw
        self._coeffs = np.array(DEFAULT_COEFFICIENTS if coeffs is None else coeffs, np.float64)
        if self._coeffs.shape != (5,) or self._coeffs.min() < 0:
            raise ValueError(f"need 5 non-negative coefficients, got {coeffs!r}")
        self._c = tuple(self._coeffs.tolist())  # the same, as floats: per-call conversion costs
        self.holdout_every, self.refit_every = holdout_every, refit_every
        self.min_fit_samples = min_fit_samples
        held = max(1, window // holdout_every)
        self._train: deque[tuple[float, float, float]] = deque(maxlen=window - held)
        self._holdout: deque[tuple[float, float, float]] = deque(maxlen=held)
        self._seen = 0        # observations ever fed in
        self._new = 0         # observations since the last refit
        self._fitted_on = 0   # training samples behind the current coefficients (0: none)
        self._mape: float | None = None
        self._version = 0     # bumped whenever the coefficients change
        #: summed feature rows of prefill questions (num_tokens, already, token_budget)
        self._rows: dict[tuple[int, int, int | None], tuple[float, ...]] = {}
        self._full_batch: dict[int, float] = {}  # full_batch_time, under these coefficients
        self._chunk_constants = _chunk_constants(model, hw)

    # -- predictions ----------------------------------------------------------------------

    def predict(self, shape: BatchShape) -> float:
        """Seconds to run `shape`; 0 for an empty batch."""
        if not shape.num_tokens:
            return 0.0
        t_m, t_f = times(shape, self.model, self.hw)
        c1, c2, c3, c4, c5 = self._c
        return c1 * (t_m + t_f) + c2 * max(t_m, t_f) + c3 * t_m + c4 * t_f + c5

    batch_time = predict

    def prefill_rows(self, num_tokens, already=0, token_budget: int | None = None) -> np.ndarray:
        """[requests, 5]: each request's regression features summed over the chunks that
        prefill its remaining `num_tokens` after `already` cached ones, alone on the device:
        in one batch, or with `token_budget` as a run of chunks of at most that many tokens
        (one batch each). Independent of the coefficients. Vectorised over requests."""
        c = np.atleast_1d(np.asarray(num_tokens, dtype=np.int64))
        l = np.broadcast_to(np.asarray(already, dtype=np.int64), c.shape)
        requests = c.size
        owner = np.arange(requests)
        if token_budget is not None:
            owner, c, l = _chunks(c, l, int(token_budget))
        moved, flops = prefill_bytes_and_flops(c, l, self.model)
        rows = feature_rows(moved / self.hw.bandwidth, flops / self.hw.peak_flops)
        rows = np.where((c > 0)[:, None], rows, 0.0)
        return np.stack([np.bincount(owner, weights=rows[:, j], minlength=requests)
                         for j in range(rows.shape[1])], axis=-1)

    def prefill_times(self, num_tokens, already=0, token_budget: int | None = None) -> np.ndarray:
        """Seconds to prefill each request's remaining `num_tokens` after `already` cached
        ones (see `prefill_rows`); element i equals `prefill_time` of request i exactly."""
        rows = self.prefill_rows(num_tokens, already, token_budget)
        c1, c2, c3, c4, c5 = self._c
        f1, f2, f3, f4, f5 = rows.T
        return f1 * c1 + f2 * c2 + f3 * c3 + f4 * c4 + f5 * c5

    def prefill_time(self, num_tokens: int, already: int = 0,
                     token_budget: int | None = None) -> float:
        key = (num_tokens, already, token_budget)
        row = self._rows.get(key)
        if row is None:
            if len(self._rows) >= MAX_REMEMBERED_ROWS:
                self._rows.clear()
            row = self._rows[key] = self._prefill_row(num_tokens, already, token_budget)
        f1, f2, f3, f4, f5 = row
        c1, c2, c3, c4, c5 = self._c
        return f1 * c1 + f2 * c2 + f3 * c3 + f4 * c4 + f5 * c5

    def _prefill_row(self, num_tokens: int, already: int, token_budget: int | None,
                     ) -> tuple[float, ...]:
        """`prefill_rows` of one request in plain floats (numpy's per-call cost is most of
        the time on one request): chunk by chunk, the same operations in the same order
        (`_chunk_row`), summed from the first chunk on as `np.bincount` sums them (its
        start at 0 is left out: 0.0 + x is x for the non-negative features)."""
        if num_tokens <= 0:
            return (0.0,) * 5
        budget = num_tokens if token_budget is None else int(token_budget)
        if budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {budget}")
        total = self._chunk_row(min(budget, num_tokens), already)
        for done in range(budget, num_tokens, budget):
            row = self._chunk_row(min(budget, num_tokens - done), already + done)
            total = tuple(map(operator.add, total, row))
        return total

    def _chunk_row(self, c: int, l: int) -> tuple[float, ...]:
        """The feature row of one prefill chunk of c >= 1 tokens after l cached ones, alone:
        `perf_features.prefill_bytes_and_flops` and `feature_rows`, operation for
        operation in float64 (a test holds the two equal to the last bit); the terms
        without c or l come from `_chunk_constants`."""
        (q2, kv2, q4, block, layers, per_token, w, h, head_fixed, head_per_seq,
         e, head_flops, bandwidth, peak) = self._chunk_constants
        c, l = float(c), float(l)
        tiles = float(math.ceil(c / block))
        keys_read = tiles * l + block * tiles * (tiles - 1) / 2 + c
        attn_moved = q2 * c + kv2 * keys_read
        attn_flops = q4 * (c * l + c * (c + 1) / 2)
        gemm_moved = w + c * per_token
        head_moved = head_fixed + c * h + head_per_seq
        moved = (layers * (gemm_moved + attn_moved) + head_moved) * e
        flops = layers * (2 * c * w + attn_flops) + head_flops
        t_m, t_f = moved / bandwidth, flops / peak
        return (t_m + t_f, max(t_m, t_f), t_m, t_f, 1.0)

    def full_batch_time(self, token_budget: int) -> float:
        """Seconds of one batch that fills the token budget with fresh prefill: what an HP
        instance may be busy with when an offloaded request arrives (worst-case HP latency
        = this + the request's own prefill time)."""
        seconds = self._full_batch.get(token_budget)
        if seconds is None:
            seconds = self._full_batch[token_budget] = self.predict(
                BatchShape.prefill_only(token_budget))
        return seconds

    @property
    def version(self) -> int:
        """Changes whenever the coefficients do (so any prediction may have changed)."""
        return self._version

    # -- learning -------------------------------------------------------------------------

    def observe(self, shape: BatchShape, seconds: float) -> None:
        """Record one measured batch; every `holdout_every`-th goes to the held-out set."""
        if not (seconds > 0 and math.isfinite(seconds)) or not shape.num_tokens:
            return
        t_m, t_f = times(shape, self.model, self.hw)
        self._seen += 1
        held_out = self._seen % self.holdout_every == 0
        (self._holdout if held_out else self._train).append((t_m, t_f, float(seconds)))
        self._new += 1

    def should_refit(self, num_new: int | None = None) -> bool:
        """Whether enough new observations arrived: the gap doubles from `min_fit_samples`
        up to `refit_every`, so the first minute gets several quick fits."""
        new = self._new if num_new is None else num_new
        if len(self._train) < self.min_fit_samples:
            return False
        return new >= min(self.refit_every, max(self.min_fit_samples, self._fitted_on))

    def refit(self) -> bool:
        """Fit C1..C5 on the training window; False (nothing changes) with too few samples."""
        if len(self._train) < self.min_fit_samples:
            return False
        train = _samples_array(self._train)
        rows, seconds = feature_rows(train[:, 0], train[:, 1]), train[:, 2]
        fitted = nnls(rows / seconds[:, None], np.ones_like(seconds))
        self._new, self._fitted_on = 0, len(train)
        if not self._holdout:
            self._use(fitted)
            return True
        held = _samples_array(self._holdout)
        rows, seconds = feature_rows(held[:, 0], held[:, 1]), held[:, 2]
        new_mape, old_mape = _mape(fitted, rows, seconds), _mape(self._coeffs, rows, seconds)
        if new_mape <= old_mape:
            self._use(fitted)
        self._mape = min(new_mape, old_mape)
        return True

    def _use(self, coeffs: np.ndarray) -> None:
        """Switch to new coefficients: predictions change (the remembered rows do not)."""
        if np.array_equal(coeffs, self._coeffs):
            return
        self._coeffs, self._c = coeffs, tuple(coeffs.tolist())
        self._version += 1
        self._full_batch.clear()

    # -- state ----------------------------------------------------------------------------

    @property
    def mape(self) -> float | None:
        """Mean absolute percentage error (0.1 = 10%) on held-out recent batches at the last
        refit; None before the first refit."""
        return self._mape

    @property
    def coefficients(self) -> tuple[float, ...]:
        return tuple(float(c) for c in self._coeffs)

    @property
    def num_samples(self) -> int:
        return len(self._train) + len(self._holdout)

    def to_dict(self) -> dict:
        """A JSON-able fit, to cache on disk per (model, device)."""
        return {"model": asdict(self.model), "hardware": asdict(self.hw),
                "coefficients": list(self.coefficients), "mape": self._mape}

    @classmethod
    def from_dict(cls, data: dict, **options) -> "PerfModel":
        perf = cls(ModelShape(**data["model"]), HardwareSpec(**data["hardware"]),
                   data["coefficients"], **options)
        perf._mape = data.get("mape")
        return perf


def _chunks(c: np.ndarray, l: np.ndarray, budget: int):
    """Split each request's c tokens after l into chunks of <= budget: (owner, c, l) per chunk."""
    if budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {budget}")
    count = -(-c // budget)
    owner = np.repeat(np.arange(c.size), count)
    first = np.cumsum(count) - count
    done = (np.arange(owner.size) - first[owner]) * budget
    return owner, np.minimum(budget, c[owner] - done), l[owner] + done


def _chunk_constants(model: ModelShape, hw: HardwareSpec) -> tuple:
    """What `PerfModel._chunk_row` multiplies by, worked out once: each a whole
    sub-expression of `prefill_bytes_and_flops` (integers exact, the floats evaluated in
    its order), so the rows come out the same to the last bit."""
    q, kv, h, m, vocab = model.q_size, model.kv_size, model.hidden, model.intermediate, model.vocab
    return (2 * q, 2 * kv, 4 * q, model.attn_block, model.layers,
            5 * h + 2 * q + 2 * kv + 3 * m, model.layer_weights, h, vocab * h,
            1.0 * (h + vocab), model.bytes_per_element, 2 * 1.0 * vocab * h,
            hw.bandwidth, hw.peak_flops)
