"""Fit the performance model at instance start: run a few synthetic batches on the real
executor, time each, feed (shape, seconds) to the model, refit.

The batches are made of throw-away requests with random tokens whose KV blocks come from
a private BlockManager over the executor's cache and are freed right after, so this must
run before the engine's own scheduler hands out blocks. What they write into the cache is
garbage that later requests overwrite.
"""
from __future__ import annotations

import random
import time
from typing import NamedTuple

from engines.batch import Batch
from engines.kv_cache import BlockManager
from engines.request import Request
from ipc.params import SamplingParams
from policies.batch_shape import BatchShape
from engines.perf.calibration_shapes import calibration_shapes
from engines.perf.model import PerfModel

_PARAMS = SamplingParams(max_tokens=1)


class CalibrationReport(NamedTuple):
    measured: int    # batches timed and observed
    skipped: int     # shapes that did not fit the cache or the model's context
    seconds: float   # wall time spent


def default_shapes(executor, token_budget: int, max_batch: int,
                   max_context: int | None = None) -> list[BatchShape]:
    """`calibration_shapes` sized to what the executor's KV cache and model can hold."""
    longest = min(max_context or executor.max_model_len, executor.max_model_len)
    # each sequence can waste most of a block, so keep one block per sequence spare
    spare_blocks = max(0, executor.num_kv_blocks - max_batch)
    return calibration_shapes(token_budget, longest, max_batch,
                              max_kv_tokens=spare_blocks * executor.block_size)


def measure(executor, shapes: list[BatchShape], *, repeats: int = 1,
            max_seconds: float = float("inf"), seed: int = 0, timer=None, progress=None):
    """Run each shape on `executor` `repeats` times, after one untimed warm-up batch.
    Returns ([(shape, seconds), ...], shapes skipped because they did not fit the KV cache
    or the model's context). Stops early once `max_seconds` have passed. `timer(executor,
    batch) -> seconds` replaces the wall-clock timing (a sim executor states its latency);
    `progress()` is called after each shape (a progress bar's update)."""
    timer = timer or _timed
    blocks = BlockManager(executor.num_kv_blocks, executor.block_size)
    vocab = executor.vocab_size or 2
    max_len = executor.max_model_len
    rng = random.Random(seed)
    start, timings, skipped, warm = time.perf_counter(), [], 0, False
    for shape in shapes:
        built = _build(shape, blocks, rng, vocab, max_len)
        if progress is not None:
            progress()
        if built is None:
            skipped += 1
            continue
        batch, requests = built
        try:
            if not warm:
                timer(executor, batch)
                warm = True
            timings += [(shape, timer(executor, batch)) for _ in range(repeats)]
        finally:
            for request in requests:
                blocks.free(request)
        if time.perf_counter() - start > max_seconds:
            break
    return timings, skipped


def calibrate(executor, perf_model: PerfModel, shapes: list[BatchShape], *, repeats: int = 2,
              max_seconds: float = 5.0, seed: int = 0, timer=None) -> CalibrationReport:
    """Time every shape (`measure`), feed each timing to `perf_model`, refit it."""
    start = time.perf_counter()
    timings, skipped = measure(executor, shapes, repeats=repeats, max_seconds=max_seconds,
                               seed=seed, timer=timer)
    for shape, seconds in timings:
        perf_model.observe(shape, seconds)
    perf_model.refit()
    return CalibrationReport(len(timings), skipped, time.perf_counter() - start)


def _timed(executor, batch: Batch) -> float:
    """Seconds one execute takes, with the GPU's queue drained before and after."""
    sync = _cuda_sync(executor.device)
    sync()
    begin = time.perf_counter()
    executor.execute(batch)
    sync()
    return time.perf_counter() - begin


def _cuda_sync(device):
    if getattr(device, "type", None) != "cuda":
        return lambda: None
    import torch
    return lambda: torch.cuda.synchronize(device)


def _build(shape: BatchShape, blocks: BlockManager, rng: random.Random, vocab: int,
           max_len: int | None):
    """A Batch of dummy requests with `shape`'s composition and their KV blocks allocated;
    None (nothing held) when it does not fit."""
    pieces = [(int(c), int(l), False) for c, l in zip(shape.prefill_tokens, shape.prefill_cached)]
    pieces += [(1, max(1, int(ctx) - 1), True) for ctx in shape.decode_context]
    batch, requests = Batch(), []
    for i, (num_new, cached, decode) in enumerate(pieces):
        if max_len is not None and cached + num_new > max_len:
            break
        request = _dummy(f"calibrate-{i}", num_new, cached, decode, rng, vocab)
        if not blocks.allocate(request, num_new):
            break
        requests.append(request)
        batch.add(request, num_new)
    else:
        return batch, requests
    for request in requests:
        blocks.free(request)
    return None


def _dummy(request_id: str, num_new: int, cached: int, decode: bool, rng: random.Random,
           vocab: int) -> Request:
    """A request with `cached` tokens already computed and `num_new` to compute; a decode's
    new token is a generated one (so the chunk is a real decode)."""
    prompt_len = cached if decode else cached + num_new
    request = Request(request_id, [rng.randrange(vocab) for _ in range(prompt_len)], _PARAMS)
    if decode:
        request.token_ids.append(rng.randrange(vocab))
    request.num_computed_tokens = cached
    return request


def stated_latency(executor, batch: Batch) -> float:
    """A sim executor's latency for `batch`, without waiting it out."""
    return executor.latency_fn(batch)
