"""A measured profile: this machine's executor timed over a grid of steps (`ascendra
profile`), as a file, and the step-time model the simulator reads off it.

The file (`ProfileFile`, msgspec JSON, `format` versioned) says what was measured -- the
device, the torch and driver versions, the model's shape and dtype, the TP degree, the
KV cache's size, the date -- and every timed step: its shape (prefill chunks of `c`
tokens after `l` cached ones, decodes attending to `ctx` tokens) and the seconds of each
repetition, so the spread is kept.

`MeasuredProfile` stands where a built-in `GpuProfile` stands (`--profile FILE` beside
the names, `profile:FILE` in a latency spec): its `step_time` is a non-negative linear
fit, on relative error, of the median times over five costs a step pays --

    t = a + b tokens + c sequences + d prefill attention (sum of c (l + (c+1)/2))
          + e decode attention (sum of ctx)

-- the per-step constant, the GEMMs' token count, the per-sequence work (sampling, the
LM head), and the two attentions. It is fitted once when the file is read; `fit_mape`
says how well it fits the grid. KV capacity is the profiled executor's.

Format 2 adds `host`: the daemon's own path timed live (`ascendra profile` without
`--no-host`): groups of requests sent together through a real daemon on this executor
by the load generator, what its client saw (`HostSample`). What the daemon adds to the
executor's steps -- HTTP, the event loops, two ZeroMQ hops, scheduling, detokenization,
the client -- is read off them against the step-time fit (`HostCosts`, `host_costs`):
a cost per step and per sequence of a step (mean time between tokens beyond the fitted
decode step), and a cost per request (time to first token beyond its first step). The
simulator charges them (bench/sim: an arrival reaches the controller that much later,
each step lasts that much longer); a sim daemon does not (it pays its own). A format 1
file reads as one without them.

Format 3 adds steps of kind "spread": decode batches whose contexts differ, as traffic
makes them (requests at every stage of their answers), where the grid's other decodes
all share one context. A backend may cost more than the sum of its contexts for them --
on CPU, SDPA pads each run of decodes to its longest and masks the rest, and a masked
call is slower per position -- so a file that has them fits a sixth cost, the decode
padding (`padding`: positions short of the batch's longest decode context, 0 when they
are all one length). A file without them (format 1, 2) fits the five, as before.

Format 4 adds `overhead`: the instance's own time around the executor's steps in the
live phase, read off its step log (`serve --step-log`: each step's whole turn less the
executor's call), by the step's sequences (`StepOverhead`). The per-step host costs are
then fitted to it directly. Without it (format 2, 3) they are the live phase's mean time
between tokens less the fitted decode step -- which takes in the fit's error at those
batches as well: on this project's 2-core VM that read 0.5-1.0 ms for a step of 13
sequences where the instance's own step log shows 0.25-0.33 ms, a tenth of such a step,
which the queue near capacity doubles and more (docs/measured_profiles.md, 2026-11-29,
third).
"""
from __future__ import annotations

import dataclasses
import functools
import statistics
from pathlib import Path

import msgspec
import numpy as np

from engines.executors.profiles.kv_capacity import kv_bytes_per_token, weight_bytes
from policies.batch_shape import BatchShape
from engines.perf.hardware_spec import HardwareSpec
from engines.perf.model_shape import ModelShape
from engines.perf.nnls import nnls

#: The file format this code writes; it reads these, and refuses any other.
PROFILE_FORMAT = 4
READ_FORMATS = (1, 2, 3, 4)
STEP_KINDS = ("prefill", "decode", "mixed", "spread")
FEATURE_NAMES = ("constant", "tokens", "sequences", "prefill_attention", "decode_attention")


class TimedStep(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One grid point: a step's shape and the seconds each repetition took."""

    kind: str
    prefills: list[tuple[int, int]]   # (c new tokens, l cached before them) per chunk
    decodes: list[int]                # context of each decode, its own token included
    seconds: list[float]

    def shape(self) -> BatchShape:
        return BatchShape.of(self.prefills, self.decodes)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def spread(self) -> float:
        """(max - min) / median of its repetitions."""
        return (max(self.seconds) - min(self.seconds)) / self.median


class HostSample(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One live timing of the daemon's path: `batch` requests sent together, each a prompt
    of `prompt_len` tokens asking `output_len`; what the client saw of each."""

    batch: int
    prompt_len: int
    output_len: int
    ttft_s: list[float]       # each request's time to first token
    tbt_s: list[float]        # each request's mean time between tokens


class StepOverhead(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The live phase's steps of `num_seqs` sequences: the median of the instance's own
    time around the executor's call (the step's turn less the call), and how many."""

    num_seqs: int
    seconds: float
    steps: int


class HostCosts(msgspec.Struct, frozen=True):
    """What the daemon's path adds to the executor's fitted steps (seconds)."""

    request_s: float          # a request's time to first token beyond its first step
    step_s: float             # a step's, beyond the executor's
    step_per_seq_s: float     # and for each sequence it runs

    def step(self, num_seqs: int) -> float:
        return self.step_s + self.step_per_seq_s * num_seqs


class ProfileFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: int
    device: str                 # "cpu (N threads)" or the GPU's name
    torch_version: str
    driver_version: str         # CUDA driver, "" on CPU
    model_dir: str
    model: ModelShape
    dtype: str
    tp: int
    date: str                   # ISO 8601, UTC
    block_size: int
    num_kv_blocks: int          # the profiled executor's KV cache
    max_model_len: int
    hardware: HardwareSpec      # the roofline numbers the performance model starts from
    repeats: int
    steps: list[TimedStep]
    #: format 2: the daemon's path timed live; None = not timed (format 1, `--no-host`)
    host: list[HostSample] | None = None
    #: format 4: the instance's own time a step in that live phase; None = not logged
    overhead: list[StepOverhead] | None = None


def write_profile(path: str | Path, profile: ProfileFile) -> None:
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(profile)) + b"\n")


def read_profile(path: str | Path) -> ProfileFile:
    """The file at `path`, checked; ValueError naming the file and what is wrong."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"profile file {str(path)!r}: {exc.strerror or exc}") from None
    try:
        version = msgspec.json.decode(raw, type=_Version).format
    except msgspec.DecodeError as exc:
        raise ValueError(f"profile file {str(path)!r} is not a profile: {exc}") from None
    if version not in READ_FORMATS:
        raise ValueError(f"profile file {str(path)!r} has format {version}; this version of "
                         f"Ascendra reads formats {READ_FORMATS} (run `ascendra profile` again)")
    try:
        profile = msgspec.json.decode(raw, type=ProfileFile)
    except msgspec.DecodeError as exc:
        raise ValueError(f"profile file {str(path)!r} is malformed: {exc}") from None
    _check(profile, path)
    return profile


class _Version(msgspec.Struct):
    format: int


def _check(profile: ProfileFile, path) -> None:
    where = f"profile file {str(path)!r}"
    if not profile.steps:
        raise ValueError(f"{where} has no timed steps")
    for i, step in enumerate(profile.steps):
        if step.kind not in STEP_KINDS:
            raise ValueError(f"{where}: steps[{i}].kind {step.kind!r} is not one of {STEP_KINDS}")
        if not step.seconds or min(step.seconds) <= 0:
            raise ValueError(f"{where}: steps[{i}].seconds must be > 0, at least one")
        if not step.prefills and not step.decodes:
            raise ValueError(f"{where}: steps[{i}] runs nothing")
        try:
            step.shape()
        except ValueError as exc:
            raise ValueError(f"{where}: steps[{i}]: {exc}") from None
    if min(profile.block_size, profile.num_kv_blocks, profile.max_model_len, profile.tp) < 1:
        raise ValueError(f"{where}: block_size, num_kv_blocks, max_model_len and tp must be >= 1")
    for i, sample in enumerate(profile.host or ()):
        if (min(sample.batch, sample.prompt_len) < 1 or sample.output_len < 2
                or len(sample.ttft_s) != sample.batch or len(sample.tbt_s) != sample.batch
                or min(sample.ttft_s + sample.tbt_s) <= 0):
            raise ValueError(f"{where}: host[{i}] must have batch, prompt_len >= 1, "
                             f"output_len >= 2 and batch times > 0 of each kind")
    if profile.host is not None and not any(s.batch == 1 for s in profile.host):
        raise ValueError(f"{where}: host has no sample of batch 1 (a request alone)")
    for i, entry in enumerate(profile.overhead or ()):
        if entry.num_seqs < 1 or entry.steps < 1 or entry.seconds < 0:
            raise ValueError(f"{where}: overhead[{i}] must have num_seqs and steps >= 1 and "
                             f"seconds >= 0")
    if profile.overhead is not None and profile.host is None:
        raise ValueError(f"{where}: overhead without host samples (both come from the live "
                         f"phase)")


def features(shape: BatchShape) -> np.ndarray:
    """The five costs of `FEATURE_NAMES` for one step."""
    prefill_attention = sum(c * (l + (c + 1) / 2) for c, l in shape.prefills)
    return np.array([1.0, shape.num_tokens, shape.num_seqs, prefill_attention,
                     shape.decode_context_sum], np.float64)


def padding(shape: BatchShape) -> int:
    """Decode positions short of the step's longest decode context: what padding every
    decode to the longest would add (0 when they are all one length)."""
    decodes = shape.decodes
    return len(decodes) * max(decodes) - shape.decode_context_sum if decodes else 0


class MeasuredProfile:
    """A profile file as the simulator, capacity and plan read a `GpuProfile`."""

    def __init__(self, path: str | Path, data: ProfileFile) -> None:
        self.name = str(path)
        self.data = data
        self.model: ModelShape = data.model
        self.hardware: HardwareSpec = data.hardware
        self.description = f"measured: {data.device}, {data.model_dir}, {data.dtype}, {data.date}"
        #: fit the decode padding too (a file with "spread" steps: format 3)
        self.pads = any(step.kind == "spread" for step in data.steps)
        rows = np.stack([self._features(s.shape()) for s in data.steps])
        medians = np.array([s.median for s in data.steps])
        scale = 1.0 / medians  # relative error: a 5 ms decode matters as a 500 ms prefill
        self.coefficients = nnls(rows * scale[:, None], np.ones_like(medians))
        self.fit_mape = float(np.mean(np.abs(rows @ self.coefficients - medians) / medians))
        #: What the daemon's path adds to these steps; None = not measured.
        self.host: HostCosts | None = (host_costs(data.host, self, data.overhead)
                                       if data.host else None)

    @property
    def ops(self) -> None:
        """A built-in profile's operator table; a measured one has none to load."""
        return None

    def step_time(self, shape: BatchShape, num_sampling: int | None = None) -> float:
        """Predicted seconds of one step running `shape` (`num_sampling` is part of the
        per-sequence cost it measured)."""
        if not shape.num_tokens:
            return 0.0
        return float(self._features(shape) @ self.coefficients)

    def _features(self, shape: BatchShape) -> np.ndarray:
        """The costs this file fits: `features`, and `padding` when it has spread steps."""
        if not self.pads:
            return features(shape)
        return np.append(features(shape), float(padding(shape)))

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.model)

    @property
    def weight_bytes(self) -> int:
        return weight_bytes(self.model)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.data.num_kv_blocks * self.data.block_size

    def kv_capacity(self, max_num_batched_tokens: int | None = None,
                    max_num_seqs: int | None = None) -> int:
        """The profiled executor's KV cache, in tokens (its reserve was already taken)."""
        return self.kv_capacity_tokens

    def num_kv_blocks(self, block_size: int, max_num_batched_tokens: int | None = None,
                      max_num_seqs: int | None = None) -> int:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        return self.kv_capacity_tokens // block_size


def host_costs(samples: list[HostSample], profile: MeasuredProfile,
               overhead: list[StepOverhead] | None = None) -> HostCosts:
    """The daemon's costs beyond `profile`'s fitted steps, from live `samples` (and the
    instance's own time a step in them, `overhead`, when its step log was kept).

    Per step: with `overhead`, the instance's own time by sequences in the step (each
    size's steps-weighted median), fitted non-negative as `step_s + step_per_seq_s x
    sequences`; without it, each batch's median mean-TBT less the fitted decode step of
    that batch over the contexts its tokens saw (prompt + 1 .. prompt + output - 1),
    fitted the same way -- what the fit gets wrong at these shapes then lands in them
    too. Per request: a lone request's median TTFT less its fitted prefill step and that
    step's host cost. They are what the simulator needs added to match the daemon,
    measured, not a breakdown of where the time goes."""
    extra = _overhead_by_size(overhead) if overhead else _tbt_beyond_fit(samples, profile)
    sizes = sorted(extra)
    rows = np.array([[1.0, float(n)] for n in sizes])
    values = np.array([max(0.0, extra[n]) for n in sizes])
    step_s, per_seq = nnls(rows, values) if len(sizes) > 1 else (values[0], 0.0)
    alone = [s for s in samples if s.batch == 1]
    first = profile.step_time(BatchShape.prefill_only(alone[0].prompt_len))
    ttft = statistics.median(t for s in alone for t in s.ttft_s)
    request_s = max(0.0, ttft - first - (step_s + per_seq))
    return HostCosts(float(request_s), float(step_s), float(per_seq))


def _tbt_beyond_fit(samples: list[HostSample], profile: MeasuredProfile) -> dict[int, float]:
    """Each batch size's median mean-TBT beyond the fitted decode step."""
    by_batch: dict[int, list[float]] = {}
    for sample in samples:
        by_batch.setdefault(sample.batch, []).extend(
            tbt - _decode_seconds(profile, sample) for tbt in sample.tbt_s)
    return {b: statistics.median(v) for b, v in by_batch.items()}


def _overhead_by_size(overhead: list[StepOverhead]) -> dict[int, float]:
    """Each step size's overhead, the entries of that size weighted by their steps (a
    joined file has one entry per size from each timing)."""
    by_size: dict[int, list[StepOverhead]] = {}
    for entry in overhead:
        by_size.setdefault(entry.num_seqs, []).append(entry)
    return {n: sum(e.seconds * e.steps for e in entries) / sum(e.steps for e in entries)
            for n, entries in by_size.items()}


def _decode_seconds(profile: MeasuredProfile, sample: HostSample) -> float:
    """The fitted decode step of `sample`'s batch, averaged over its tokens' contexts."""
    contexts = range(sample.prompt_len + 1, sample.prompt_len + sample.output_len)
    return statistics.fmean(profile.step_time(BatchShape.of(decodes=[c] * sample.batch))
                            for c in contexts)


def is_profile_file(name: str) -> bool:
    """A `--profile` value naming a file rather than a built-in profile."""
    return name.endswith(".json") or "/" in name or Path(name).is_file()


@functools.lru_cache(maxsize=16)
def _load(path: str, mtime_ns: int) -> MeasuredProfile:
    return MeasuredProfile(path, read_profile(path))


def load_measured(path: str | Path) -> MeasuredProfile:
    """The measured profile in the file at `path` (read once while the file is unchanged)."""
    try:
        mtime = Path(path).stat().st_mtime_ns
    except OSError as exc:
        raise ValueError(f"profile file {str(path)!r}: {exc.strerror or exc}") from None
    return _load(str(path), mtime)


def check_model(profile: MeasuredProfile, model: ModelShape, model_dir: str) -> None:
    """A profile measured on another model's shape is refused (its times are not this
    one's); the element size is the executor's dtype, not the model's, and may differ."""
    same_dtype = dataclasses.replace(model, bytes_per_element=profile.model.bytes_per_element)
    if profile.model != same_dtype:
        raise ValueError(f"profile {profile.name!r} was measured on a model of shape "
                         f"{profile.model} ({profile.data.model_dir}); {model_dir} has "
                         f"shape {model}")
