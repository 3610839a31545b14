"""Named workloads: a `WorkloadSpec` says what a run sends, reproducibly from a seed.

`simulate`, `capacity` and the live `bench` build their requests alike with
`build_requests(spec, rate=..., num_requests=... | duration=..., seed=...)`. The names
(WORKLOADS), each usable with any trace (`trace`: sharegpt, arxiv, azure-conv or a file):

* `poisson`    -- exponential gaps (CV 1) at the rate;
* `bursty-cv2` -- gamma gaps, CV 2 (shape 1/4, as `--burstiness 0.25`);
* `bursty-cv4` -- gamma gaps, CV 4 (shape 1/16);
* `onoff`      -- a two-state Markov-modulated Poisson process (bench/loadgen/arrivals.py
  `OnOff`): ON periods of mean 10 s at 3x the rate, OFF periods of mean 30 s at 1/3x,
  both exponential; long-run mean rate = the rate;
* `mixed-slo`  -- Poisson, each request drawing an SLO class (SLO_CLASSES) in the
  shares DEFAULT_SLO_MIX (`slo_mix` gives any workload classes the same way);
* `system-prompt` -- Poisson, every prompt a shared 1,000-token system prompt and then
  the trace's prompt as its question (bench/loadgen/reuse_workloads.py; `system_prompt_len`,
  `system_prompts`);
* `multi-turn` -- conversations of 5 turns, each turn's prompt the one before it plus
  more (the history), 15 s of think time apart (bench/loadgen/reuse_workloads.py; `turns`,
  `think_time`);
* `shifting`   -- phases that change the traffic's character: uniform-SLO Poisson, then
  mixed SLO classes with a large interactive share (`slo_mix`, default SHIFT_MIX), then
  bursty CV 4, each `phase_seconds` long (default 60 s), repeated
  (bench/loadgen/shifting.py);
* `replay`     -- the arrival times of a trace with them (`azure-conv`, or a file:
  bench/loadgen/trace_file.py finds them): in time order, divided by `rate_scale` (2 = twice
  as fast); a `rate` instead sets the scale so that the mean rate of the replayed rows is
  that rate (with a `duration`: of the whole file). Never both. `num_requests` rows are
  one consecutive stretch of the trace, each seed its own (`replay_start`): seed 0 from
  the first row, seed k from row k x num_requests while that fits; a `duration` replays
  from the first row whatever the seed.

Any workload may name its senders: `tenant_mix` (`--tenant-mix`,
bench/loadgen/tenant_mix.py) draws each request's tenant and priority by share, from a seed
stream of its own (the arrivals and lengths stay those of the run without it).

A generated workload on a trace with arrival times uses only its lengths. Lengths are
fitted as bench/loadgen/workload.py `fit_lengths` says (length_scale, max_prompt_len, then
max_model_len: the output is kept, the prompt cut).
"""
from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Literal

import msgspec
import numpy as np

from bench.loadgen.arrivals import (
    DEFAULT_ONOFF,
    OnOff,
    arrival_offsets,
    arrivals_within,
    onoff_offsets,
)
from bench.loadgen.reuse_workloads import conversation_requests, system_prompt_requests
from bench.loadgen.shifting import DEFAULT_PHASE_SECONDS, PHASES
from bench.loadgen.tenant_mix import TenantShare, assign_tenants, check_tenant_mix
from bench.loadgen.trace_file import BLOCK_TOKENS, TraceRow, load_rows
from bench.loadgen.workload import PromptPart, WorkloadRequest, fit_lengths, sample_rows

Arrival = Literal["poisson", "gamma", "onoff", "replay", "shifting"]


class SloClass(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    ttft_slo: float     # seconds
    tbt_slo: float      # seconds, mean time between tokens


class SloShare(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    slo_class: str      # a class's name
    share: float        # of the requests, 0..1


SLO_CLASSES = (SloClass("interactive", 0.5, 0.1), SloClass("standard", 2.0, 0.15),
               SloClass("batch", 30.0, 0.5))
DEFAULT_SLO_MIX = (SloShare("interactive", 0.3), SloShare("standard", 0.5), SloShare("batch", 0.2))
#: The mixed phase of `shifting`: a large interactive share.
SHIFT_MIX = (SloShare("interactive", 0.6), SloShare("standard", 0.3), SloShare("batch", 0.1))


class WorkloadSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str = "poisson"
    trace: str = "sharegpt"
    arrival: Arrival = "poisson"
    burstiness: float = 1.0             # gamma shape = 1/CV^2 (arrival "gamma")
    onoff: OnOff = DEFAULT_ONOFF        # arrival "onoff"
    #: The classes requests draw and their shares (summing to 1); None: the run's SLOs.
    slo_mix: tuple[SloShare, ...] | None = None
    slo_classes: tuple[SloClass, ...] = SLO_CLASSES
    arrival_column: str | None = None   # replay: the column of arrival times (default: found)
    arrival_unit: str | None = None     # replay: s, ms or us (default: the column's)
    rate_scale: float | None = None     # replay: > 1 compresses time
    max_prompt_len: int | None = None   # prompts longer are trimmed to this
    length_scale: float = 1.0           # both lengths divided by this
    #: Every prompt starts with one of `system_prompts` shared prompts of this many tokens.
    system_prompt_len: int = 0
    system_prompts: int = 1
    #: Conversations of this many turns, each prompt the one before it and more; 1 = none.
    turns: int = 1
    think_time: float = 15.0            # seconds between a conversation's turns (mean)
    #: `shifting`: seconds of its poisson, mixed-slo and bursty-cv4 phases (empty: 60 each;
    #: bench/loadgen/shifting.py).
    phase_seconds: tuple[float, ...] = ()
    #: Who sends the requests: each arrival draws a tenant by share (None: no tenants;
    #: bench/loadgen/tenant_mix.py).
    tenant_mix: tuple[TenantShare, ...] | None = None


WORKLOADS = {
    "poisson": WorkloadSpec(name="poisson"),
    "bursty-cv2": WorkloadSpec(name="bursty-cv2", arrival="gamma", burstiness=1 / 4),
    "bursty-cv4": WorkloadSpec(name="bursty-cv4", arrival="gamma", burstiness=1 / 16),
    "onoff": WorkloadSpec(name="onoff", arrival="onoff"),
    "mixed-slo": WorkloadSpec(name="mixed-slo", slo_mix=DEFAULT_SLO_MIX),
    "system-prompt": WorkloadSpec(name="system-prompt", system_prompt_len=1000),
    "multi-turn": WorkloadSpec(name="multi-turn", turns=5),
    "replay": WorkloadSpec(name="replay", arrival="replay"),
    "shifting": WorkloadSpec(name="shifting", arrival="shifting", slo_mix=SHIFT_MIX),
}


def workload(name: str, **changes) -> WorkloadSpec:
    """The named workload, with `changes` to its fields (e.g. trace=...)."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    return msgspec.structs.replace(WORKLOADS[name], **changes)


def parse_slo_mix(text: str, classes: tuple[SloClass, ...] = SLO_CLASSES
                  ) -> tuple[SloShare, ...]:
    """'interactive=0.3,standard=0.5,batch=0.2' -> shares; classes left out get none."""
    names = [c.name for c in classes]
    mix = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, share = part.partition("=")
        name = name.strip()
        if not sep or name not in names:
            raise ValueError(f"--slo-mix {text!r}: {part!r} is not CLASS=SHARE with CLASS one of "
                             f"{', '.join(names)}")
        try:
            mix.append(SloShare(name, float(share)))
        except ValueError:
            raise ValueError(f"--slo-mix {text!r}: the share of {name} is {share!r}, "
                             f"not a number") from None
    return tuple(mix)


def check(spec: WorkloadSpec) -> None:
    """ValueError naming the field of `spec` that cannot be honoured."""
    where = f"workload {spec.name!r}"
    if spec.arrival == "gamma" and not (spec.burstiness > 0 and math.isfinite(spec.burstiness)):
        raise ValueError(f"{where}: burstiness must be > 0, got {spec.burstiness}")
    if spec.arrival != "gamma" and spec.burstiness != 1.0:
        raise ValueError(f"{where}: burstiness applies to gamma arrivals, not {spec.arrival}")
    if spec.arrival != "replay":
        given = {"rate_scale (--rate-scale)": spec.rate_scale,
                 "arrival_column (--arrival-column)": spec.arrival_column,
                 "arrival_unit (--arrival-unit)": spec.arrival_unit}
        for field, value in given.items():
            if value is not None:
                raise ValueError(f"{where}: {field} applies to a replayed trace "
                                 f"(workload replay), not to {spec.arrival} arrivals")
    if spec.rate_scale is not None and not (spec.rate_scale > 0 and math.isfinite(spec.rate_scale)):
        raise ValueError(f"{where}: rate_scale must be > 0, got {spec.rate_scale}")
    if spec.max_prompt_len is not None and spec.max_prompt_len < 1:
        raise ValueError(f"{where}: max_prompt_len must be >= 1, got {spec.max_prompt_len}")
    if not spec.length_scale > 0:
        raise ValueError(f"{where}: length_scale must be > 0, got {spec.length_scale}")
    if spec.system_prompt_len < 0 or spec.system_prompts < 1 or spec.turns < 1 or not (
            spec.think_time >= 0):
        raise ValueError(f"{where}: system_prompt_len ({spec.system_prompt_len}) and "
                         f"think_time ({spec.think_time}) must be >= 0, system_prompts "
                         f"({spec.system_prompts}) and turns ({spec.turns}) >= 1")
    if (spec.turns > 1 or spec.system_prompt_len) and spec.arrival not in ("poisson", "gamma"):
        raise ValueError(f"{where}: a workload with reuse takes poisson or gamma arrivals, "
                         f"not {spec.arrival}")
    if spec.turns > 1 and spec.system_prompt_len:
        raise ValueError(f"{where}: give turns or a system prompt, not both")
    if spec.phase_seconds and (spec.arrival != "shifting" or len(spec.phase_seconds) != 3
                               or not all(s > 0 and math.isfinite(s) for s in spec.phase_seconds)):
        raise ValueError(f"{where}: phase_seconds (--phase-seconds) takes three lengths > 0, "
                         f"for workload shifting only; got {list(spec.phase_seconds)}")
    if spec.slo_mix is not None:
        names = [c.name for c in spec.slo_classes]
        mixed = [s.slo_class for s in spec.slo_mix]
        shares = [s.share for s in spec.slo_mix]
        if set(mixed) - set(names) or len(set(mixed)) < len(mixed):
            raise ValueError(f"{where}: slo_mix names {mixed}; each at most once, and one of "
                             f"the classes {', '.join(names)}")
        if any(not (s >= 0 and math.isfinite(s)) for s in shares) or abs(sum(shares) - 1) > 0.01:
            text = ",".join(f"{s.slo_class}={s.share:g}" for s in spec.slo_mix)
            raise ValueError(f"{where}: the slo_mix shares must be >= 0 and sum to 1, got {text}")
    if spec.tenant_mix is not None:
        try:
            check_tenant_mix(spec.tenant_mix)
        except ValueError as exc:
            raise ValueError(f"{where}: tenant_mix (--tenant-mix): {exc}") from None


def build_requests(spec: WorkloadSpec, *, rate: float | None = None,
                   num_requests: int | None = None, duration: float | None = None,
                   seed: int = 0, max_model_len: int | None = None,
                   rows: list[TraceRow] | None = None) -> list[WorkloadRequest]:
    """`num_requests` requests, or every arrival within `duration` seconds, at `rate`
    requests/s (inf: all at once; for `replay`, None keeps the trace's own times).
    `rows` replaces the trace (its rows, already read). With a tenant mix each request
    then draws its tenant (`_with_tenants`): arrivals and lengths are the same as without."""
    check(spec)
    return _with_tenants(spec, seed, _requests(spec, rate=rate, num_requests=num_requests,
                                               duration=duration, seed=seed,
                                               max_model_len=max_model_len, rows=rows))


def _requests(spec: WorkloadSpec, *, rate: float | None, num_requests: int | None,
              duration: float | None, seed: int, max_model_len: int | None,
              rows: list[TraceRow] | None) -> list[WorkloadRequest]:
    if (num_requests is None) == (duration is None):
        raise ValueError("give exactly one of num_requests and duration")
    rows = list(rows) if rows is not None else trace_rows(spec)
    if spec.arrival == "replay":
        if not rows or rows[0].arrival is None:
            raise ValueError(f"workload replay: trace {spec.trace} has no arrival times (no "
                             f"column named one of the known names); name its column with "
                             f"--arrival-column, or pick a generated workload")
        arrivals, rows = replayed(rows, spec.rate_scale, rate, num_requests, duration,
                                  seed)
    elif rate is None:
        raise ValueError(f"workload {spec.name!r} needs an arrival rate (--qps)")
    elif spec.arrival == "shifting":
        return shifting_requests(spec, rate=rate, num_requests=num_requests,
                                 duration=duration, seed=seed, max_model_len=max_model_len)
    elif spec.turns > 1:
        return _with_classes(spec, seed, conversation_requests(
            rows, turns=spec.turns, think_time=spec.think_time, rate=rate,
            burstiness=spec.burstiness if spec.arrival == "gamma" else 1.0,
            num_requests=num_requests, duration=duration, seed=seed,
            length_scale=spec.length_scale, max_prompt_len=spec.max_prompt_len,
            max_model_len=max_model_len))
    else:
        arrivals = _generated(spec, rate, num_requests, duration, seed)
        rows = sample_rows(rows, len(arrivals), seed)
        if spec.system_prompt_len:
            return _with_classes(spec, seed, system_prompt_requests(
                arrivals, rows, system_prompt_len=spec.system_prompt_len,
                system_prompts=spec.system_prompts, seed=seed,
                length_scale=spec.length_scale, max_prompt_len=spec.max_prompt_len,
                max_model_len=max_model_len))
    classes = _classes(spec, len(arrivals), seed)
    by_name = {c.name: c for c in spec.slo_classes}
    requests = []
    for i, (arrival, row, name) in enumerate(zip(arrivals, rows, classes)):
        slo = by_name[name] if name is not None else None
        prompt_len, output_len = fit_lengths(row, spec.length_scale, spec.max_prompt_len,
                                             max_model_len)
        requests.append(WorkloadRequest(
            i, float(arrival), prompt_len, output_len,
            ttft_slo=slo.ttft_slo if slo else None, tbt_slo=slo.tbt_slo if slo else None,
            slo_class=name, prompt_parts=hash_parts(row, i, prompt_len, spec.length_scale)))
    return requests


#: The first key of a PromptPart made from a trace's block id, and of the rest of a prompt
#: its blocks fall short of (reuse_workloads.py uses 1-3).
HASH_BLOCK, HASH_REST = 4, 5


def hash_parts(row: TraceRow, index: int, prompt_len: int, length_scale: float = 1.0,
               ) -> tuple[PromptPart, ...]:
    """The prompt of a row that names its blocks (`hash_ids`, Mooncake's): one part per
    block id, BLOCK_TOKENS tokens each (divided by `length_scale`), so equal ids are equal
    tokens in every request; cut to `prompt_len`, and a part of its own after the last
    block if the blocks fall short. () for a row without block ids."""
    if not row.hash_ids:
        return ()
    block = max(1, round(BLOCK_TOKENS / length_scale))
    parts, left = [], prompt_len
    for block_id in row.hash_ids:
        if left <= 0:
            break
        parts.append(PromptPart((HASH_BLOCK, block_id), min(block, left)))
        left -= parts[-1].length
    if left > 0:
        parts.append(PromptPart((HASH_REST, index), left))
    return tuple(parts)


def shifting_requests(spec, *, rate: float, num_requests: int | None, duration: float | None,
                      seed: int, max_model_len: int | None) -> list[WorkloadRequest]:
    """The `shifting` workload: `num_requests` requests, or every arrival within
    `duration` seconds, its phases (bench/loadgen/shifting.py) one after another."""
    seconds = spec.phase_seconds or DEFAULT_PHASE_SECONDS
    shared = dict(trace=spec.trace, length_scale=spec.length_scale,
                  max_prompt_len=spec.max_prompt_len)
    phases = [workload(name, **shared, **({"slo_mix": spec.slo_mix} if name == "mixed-slo"
                                           and spec.slo_mix else {}))
              for name in PHASES]
    requests: list[WorkloadRequest] = []
    start, k = 0.0, 0
    while True:
        if duration is not None and start >= duration:
            break
        if num_requests is not None and len(requests) >= num_requests:
            break
        i = k % len(PHASES)
        length = seconds[i] if duration is None else min(seconds[i], duration - start)
        for r in build_requests(phases[i], rate=rate, duration=length, seed=seed * 1000 + k,
                                max_model_len=max_model_len):
            requests.append(msgspec.structs.replace(r, index=len(requests),
                                                    arrival=start + r.arrival))
        start, k = start + seconds[i], k + 1
    return requests[:num_requests] if num_requests is not None else requests


def _with_tenants(spec: WorkloadSpec, seed: int,
                  requests: list[WorkloadRequest]) -> list[WorkloadRequest]:
    """`requests` with the tenants (and their priorities) `spec.tenant_mix` draws."""
    if not spec.tenant_mix:
        return requests
    tenants = assign_tenants(spec.tenant_mix, len(requests), seed)
    return [msgspec.structs.replace(r, tenant=t.tenant, priority=t.priority)
            for r, t in zip(requests, tenants)]


def _with_classes(spec: WorkloadSpec, seed: int,
                  requests: list[WorkloadRequest]) -> list[WorkloadRequest]:
    """`requests` with the SLO classes `spec.slo_mix` draws (as build_requests gives them)."""
    by_name = {c.name: c for c in spec.slo_classes}
    classes = _classes(spec, len(requests), seed)
    return [r if name is None else msgspec.structs.replace(
        r, ttft_slo=by_name[name].ttft_slo, tbt_slo=by_name[name].tbt_slo, slo_class=name)
        for r, name in zip(requests, classes)]


def trace_rows(spec: WorkloadSpec) -> list[TraceRow]:
    """The rows of `spec.trace`, with arrival times only when the workload replays them."""
    if spec.arrival == "replay":
        return _rows(spec.trace, spec.arrival_column, spec.arrival_unit)
    return [msgspec.structs.replace(r, arrival=None) for r in _rows(spec.trace)]


def num_requests_or(spec: WorkloadSpec, default: int) -> int:
    """How many requests a run sends when not told: every row of a replayed trace, else
    `default`."""
    return len(trace_rows(spec)) if spec.arrival == "replay" else default


def is_timed(trace: str, arrival_column: str | None = None) -> bool:
    """Whether `trace` has arrival times (so a run replays it unless told otherwise)."""
    rows = _rows(trace, arrival_column)
    return bool(rows) and rows[0].arrival is not None


def _rows(trace: str, column: str | None = None, unit: str | None = None) -> list[TraceRow]:
    """load_rows, read once per file version: a capacity search builds many workloads."""
    path = Path(trace)
    stamp = (path.stat().st_mtime_ns, path.stat().st_size) if path.is_file() else None
    return list(_read(trace, column, unit, stamp))


@functools.lru_cache(maxsize=8)
def _read(trace: str, column: str | None, unit: str | None, stamp) -> tuple[TraceRow, ...]:
    return tuple(load_rows(trace, column, unit))


def _generated(spec: WorkloadSpec, rate: float, num_requests: int | None,
               duration: float | None, seed: int) -> np.ndarray:
    if spec.arrival == "onoff":
        return onoff_offsets(rate, spec.onoff, seed, n=num_requests, duration=duration)
    shape = spec.burstiness if spec.arrival == "gamma" else 1.0
    if num_requests is not None:
        return arrival_offsets(num_requests, rate, shape, seed)
    return arrivals_within(duration, rate, shape, seed)


def replayed(rows: list[TraceRow], rate_scale: float | None, rate: float | None,
             num_requests: int | None, duration: float | None, seed: int = 0):
    """(arrival offsets, rows) of a replay: sorted, the seed's stretch, from 0, scaled, cut
    (module docstring)."""
    if rate is not None and rate_scale is not None:
        raise ValueError("a replayed trace takes --qps (its target mean rate) or --rate-scale, "
                         "not both")
    rows = sorted(rows, key=lambda r: r.arrival)
    if num_requests is not None:
        if num_requests > len(rows):
            raise ValueError(f"the trace has {len(rows)} timed rows; {num_requests} were asked for")
        start = replay_start(len(rows), num_requests, seed)
        rows = rows[start:start + num_requests]
    times = np.array([r.arrival for r in rows]) - rows[0].arrival
    scale = rate_scale if rate_scale is not None else 1.0
    if rate is not None:
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"--qps {rate} on a replayed trace: give a finite rate to rescale "
                             f"its times to, or none to keep them")
        if len(times) < 2 or times[-1] <= 0:
            raise ValueError("the replayed rows all arrive at one instant: they have no rate to "
                             "rescale to --qps")
        scale = rate * times[-1] / (len(times) - 1)
    times = times / scale
    if duration is not None:
        keep = times < duration
        times, rows = times[keep], [r for r, k in zip(rows, keep) if k]
    return times, rows


def replay_start(num_rows: int, num_requests: int, seed: int) -> int:
    """The first row a seed's replay of `num_requests` rows starts at: seed k at
    k x num_requests, wrapped to the starts that leave room for them all."""
    return seed * num_requests % (num_rows - num_requests + 1)


def _classes(spec: WorkloadSpec, n: int, seed: int) -> list[str | None]:
    if not spec.slo_mix:
        return [None] * n
    names = [s.slo_class for s in spec.slo_mix]
    shares = np.array([s.share for s in spec.slo_mix], dtype=float)
    picks = np.random.default_rng([seed, 4]).choice(len(names), size=n, p=shares / shares.sum())
    return [names[i] for i in picks]
