"""How long a batch takes: roofline features and an online non-negative regression (§5.1).

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
"""
from __future__ import annotations

from collections import deque
from dataclasses import asdict

import numpy as np

from policies.batch_shape import BatchShape
from policies.calibration_shapes import calibration_shapes
from policies.hardware_spec import HardwareSpec
from policies.model_shape import ModelShape
from policies.nnls import nnls
from policies.perf_features import prefill_bytes_and_flops, times

__all__ = ["COEFFICIENT_NAMES", "DEFAULT_COEFFICIENTS", "PerfModel", "calibration_shapes",
           "feature_rows"]

COEFFICIENT_NAMES = ("C1_sum", "C2_max", "C3_memory", "C4_compute", "C5_constant")
#: the roofline, plus 1 ms for launching a step
DEFAULT_COEFFICIENTS = (0.0, 1.0, 0.0, 0.0, 1e-3)


def feature_rows(t_m, t_f) -> np.ndarray:
    """[..., 5] regression features of (t_M, t_F) arrays, in the order C1..C5 multiply."""
    t_m, t_f = np.broadcast_arrays(np.asarray(t_m, np.float64), np.asarray(t_f, np.float64))
    return np.stack([t_m + t_f, np.maximum(t_m, t_f), t_m, t_f, np.ones_like(t_m)], axis=-1)


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
        self.holdout_every, self.refit_every = holdout_every, refit_every
        self.min_fit_samples = min_fit_samples
        held = max(1, window // holdout_every)
        self._train: deque[tuple[float, float, float]] = deque(maxlen=window - held)
        self._holdout: deque[tuple[float, float, float]] = deque(maxlen=held)
        self._seen = 0        # observations ever fed in
        self._new = 0         # observations since the last refit
        self._fitted_on = 0   # training samples behind the current coefficients (0: none)
        self._mape: float | None = None

    # -- predictions ----------------------------------------------------------------------

    def predict(self, shape: BatchShape) -> float:
        """Seconds to run `shape`; 0 for an empty batch."""
        if not shape.num_tokens:
            return 0.0
        t_m, t_f = times(shape, self.model, self.hw)
        c1, c2, c3, c4, c5 = self._coeffs.tolist()
        return c1 * (t_m + t_f) + c2 * max(t_m, t_f) + c3 * t_m + c4 * t_f + c5

    batch_time = predict

    def prefill_times(self, num_tokens, already=0, token_budget: int | None = None) -> np.ndarray:
        """Seconds to prefill each request's remaining `num_tokens` after `already` cached
        ones, alone on the device: in one batch, or with `token_budget` as a run of chunks
        of at most that many tokens (one batch each). Vectorised over requests."""
        c = np.atleast_1d(np.asarray(num_tokens, dtype=np.int64))
        l = np.broadcast_to(np.asarray(already, dtype=np.int64), c.shape)
        requests = c.size
        owner = np.arange(requests)
        if token_budget is not None:
            owner, c, l = _chunks(c, l, int(token_budget))
        moved, flops = prefill_bytes_and_flops(c, l, self.model)
        seconds = feature_rows(moved / self.hw.bandwidth, flops / self.hw.peak_flops) @ self._coeffs
        seconds = np.where(c > 0, seconds, 0.0)
        return np.bincount(owner, weights=seconds, minlength=requests)

    def prefill_time(self, num_tokens: int, already: int = 0,
                     token_budget: int | None = None) -> float:
        return float(self.prefill_times([num_tokens], [already], token_budget)[0])

    def full_batch_time(self, token_budget: int) -> float:
        """Seconds of one batch that fills the token budget with fresh prefill: what an HP
        instance may be busy with when an offloaded request arrives (worst-case HP latency
        = this + the request's own prefill time)."""
        return self.predict(BatchShape.prefill_only(token_budget))

    # -- learning -------------------------------------------------------------------------

    def observe(self, shape: BatchShape, seconds: float) -> None:
        """Record one measured batch; every `holdout_every`-th goes to the held-out set."""
        if not (seconds > 0 and np.isfinite(seconds)) or not shape.num_tokens:
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
        train = np.array(self._train)
        rows, seconds = feature_rows(train[:, 0], train[:, 1]), train[:, 2]
        fitted = nnls(rows / seconds[:, None], np.ones_like(seconds))
        self._new, self._fitted_on = 0, len(train)
        if not self._holdout:
            self._coeffs = fitted
            return True
        held = np.array(self._holdout)
        rows, seconds = feature_rows(held[:, 0], held[:, 1]), held[:, 2]
        new_mape, old_mape = _mape(fitted, rows, seconds), _mape(self._coeffs, rows, seconds)
        if new_mape <= old_mape:
            self._coeffs = fitted
        self._mape = min(new_mape, old_mape)
        return True

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
