"""From per-request records to the one result a run reports (`RunResult`), and its JSON.

Goodput (DESIGN.md §2): a request is *good* when it completed with TTFT <= its TTFT SLO
and mean TBT <= its TBT SLO; a request with one output token has no TBT and meets that
target. goodput_pct counts good requests over ALL requests, so dropped, errored and lost
ones are misses. Token goodput weighs each request by its prompt + output tokens (as
asked): refusing long prompts costs it more than it costs request goodput. Per SLO class
(`per_class`) and per tenant (`per_tenant`: goodput, served tokens, drops, p99 TTFT) when
the records carry them.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np

from bench.records.schema import (
    OUTCOMES, ClassResult, Percentiles, RequestRecord, RunResult, TenantResult,
)
from bench.records.summary_table import print_summary
from policies.tenants import DEFAULT_TENANT

__all__ = ["RequestRecord", "RunResult", "encode_result", "is_good", "per_class", "per_tenant",
           "percentiles", "print_summary", "read_result", "summarize", "token_goodput_pct",
           "write_result"]


def percentiles(values) -> Percentiles:
    """Mean and p50/p90/p99 (numpy's linear interpolation); all None for no values."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return Percentiles()
    p50, p90, p99 = np.percentile(data, [50, 90, 99])
    return Percentiles(float(data.mean()), float(p50), float(p90), float(p99))


def is_good(record: RequestRecord, ttft_slo: float, tbt_slo: float,
            e2el_slo: float | None = None) -> bool:
    """Completed within both targets (the record's own targets win over the run's), and
    within `e2el_slo` seconds from arrival to its last answer when one is given
    (`ascendra bench --goodput e2el:MS`, vLLM's end-to-end target)."""
    if record.outcome != "completed" or record.ttft() is None:
        return False
    if e2el_slo is not None and (record.end_time is None
                                 or record.end_time - record.arrival > e2el_slo):
        return False
    ttft_target = record.ttft_slo if record.ttft_slo is not None else ttft_slo
    tbt_target = record.tbt_slo if record.tbt_slo is not None else tbt_slo
    mean_tbt = record.mean_tbt()
    return record.ttft() <= ttft_target and (mean_tbt is None or mean_tbt <= tbt_target)


def token_goodput_pct(records: Sequence[RequestRecord], ttft_slo: float, tbt_slo: float,
                      e2el_slo: float | None = None) -> float:
    """Share of the requests' prompt + output tokens (as asked) that belonged to requests
    meeting their targets, %."""
    total = good = 0
    for r in records:
        size = r.prompt_len + r.output_len
        total += size
        good += size if is_good(r, ttft_slo, tbt_slo, e2el_slo) else 0
    return 100.0 * good / total if total else 0.0


def summarize(records: list[RequestRecord], config: dict, duration_s: float,
              ttft_slo: float, tbt_slo: float, per_instance: list[dict] | None = None,
              perf_model_mape: float | None = None, keep_records: bool = False,
              e2el_slo: float | None = None) -> RunResult:
    """Everything a run reports, from its records. Rates are per `duration_s`.

    Warm-up requests (`RequestRecord.warmup`: a multi-turn run's earlier turns, sent to
    prime the prefix cache) are left out of every figure and only counted (`primed`);
    the rates are then per the measured requests' own span, first arrival to last answer."""
    everything = records
    primed = sum(1 for r in records if r.warmup)
    if primed:
        records = [r for r in records if not r.warmup]
        ends = [r.end_time for r in records if r.end_time is not None]
        duration_s = max(ends) - min(r.arrival for r in records) if ends else 0.0
    done = [r for r in records if r.outcome == "completed"]
    counts = {o: sum(1 for r in records if r.outcome == o) for o in OUTCOMES}
    good = sum(1 for r in records if is_good(r, ttft_slo, tbt_slo, e2el_slo))
    tbt = percentiles(_all_gaps(done))
    per_second = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: 0.0)
    window = arrival_window(records)
    return RunResult(
        config=config, num_requests=len(records), duration_s=duration_s,
        ttft_slo_s=ttft_slo, tbt_slo_s=tbt_slo,
        goodput_pct=100.0 * good / len(records) if records else 0.0,
        token_goodput_pct=token_goodput_pct(records, ttft_slo, tbt_slo, e2el_slo),
        goodput_rps=per_second(good), throughput_rps=per_second(counts["completed"]),
        output_tok_s=per_second(sum(r.output_tokens() for r in records)),
        **window,
        ttft_s=percentiles([r.ttft() for r in done if r.ttft() is not None]),
        tbt_s=tbt, p99_tbt_s=tbt.p99,
        mean_tbt_s=percentiles([m for m in (r.mean_tbt() for r in done) if m is not None]),
        sched_delay_s=percentiles([r.sched_delay for r in records if r.sched_delay is not None]),
        good=good, **counts, offloaded=sum(1 for r in records if r.offloaded),
        perf_model_mape=perf_model_mape, per_instance=list(per_instance or []),
        prompt_cached_pct=cached_share(done),
        per_class=per_class(records, ttft_slo, tbt_slo, e2el_slo),
        per_tenant=per_tenant(records, ttft_slo, tbt_slo, e2el_slo),
        e2el_slo_s=msgspec.UNSET if e2el_slo is None else e2el_slo,
        primed=primed, records=list(everything) if keep_records else msgspec.UNSET)


def arrival_window(records: Sequence[RequestRecord]) -> dict[str, float]:
    """RunResult's `arrival_window_s`, `offered_rps`, `achieved_rps` and `drain_s`: a run's
    rates over its arrivals only, so the drain after the last arrival does not dilute them."""
    if not records:
        return {}
    first = min(r.arrival for r in records)
    last = max(r.arrival for r in records)
    window = last - first
    ends = [r.end_time for r in records if r.end_time is not None]
    done_in_window = sum(1 for r in records
                         if r.outcome == "completed" and r.end_time is not None
                         and r.end_time <= last)
    return {"arrival_window_s": window,
            "offered_rps": (len(records) - 1) / window if window > 0 else 0.0,
            "achieved_rps": done_in_window / window if window > 0 else 0.0,
            "drain_s": max(0.0, max(ends) - last) if ends else 0.0}


def cached_share(records: list[RequestRecord]) -> float:
    """Share of the records' prompt tokens their instances found cached, %."""
    prompt = sum(r.prompt_len for r in records)
    return 100.0 * sum(r.cached_tokens for r in records) / prompt if prompt else 0.0


def per_class(records: list[RequestRecord], ttft_slo: float, tbt_slo: float,
              e2el_slo: float | None = None) -> list[ClassResult]:
    """Goodput per SLO class, in order of first appearance; none when no record has a class
    (records without one are counted as class "default")."""
    rows = []
    for name, members in _grouped(records, "slo_class", "default").items():
        good = sum(1 for r in members if is_good(r, ttft_slo, tbt_slo, e2el_slo))
        first = members[0]
        rows.append(ClassResult(
            slo_class=name, num_requests=len(members), good=good,
            goodput_pct=100.0 * good / len(members),
            ttft_slo_s=first.ttft_slo if first.ttft_slo is not None else ttft_slo,
            tbt_slo_s=first.tbt_slo if first.tbt_slo is not None else tbt_slo))
    return rows


def per_tenant(records: Sequence[RequestRecord], ttft_slo: float, tbt_slo: float,
               e2el_slo: float | None = None) -> list[TenantResult]:
    """What each tenant got, in order of first appearance; none when no record names a
    tenant (records without one are counted as tenant "default", as the daemon counts a
    request that names none)."""
    rows = []
    for name, members in _grouped(records, "tenant", DEFAULT_TENANT).items():
        good = sum(1 for r in members if is_good(r, ttft_slo, tbt_slo, e2el_slo))
        done = [r for r in members if r.outcome == "completed"]
        rows.append(TenantResult(
            tenant=name, priority=members[0].priority, num_requests=len(members), good=good,
            goodput_pct=100.0 * good / len(members),
            served_tokens=sum(r.prompt_len + r.output_tokens() for r in done),
            dropped=sum(1 for r in members if r.outcome == "dropped"),
            p99_ttft_s=percentiles([r.ttft() for r in done if r.ttft() is not None]).p99,
            token_goodput_pct=token_goodput_pct(members, ttft_slo, tbt_slo, e2el_slo)))
    return rows


def _grouped(records: Sequence[RequestRecord], field: str, default: str,
             ) -> dict[str, list[RequestRecord]]:
    """The records by their `field`, in order of first appearance (those without one under
    `default`); empty when no record has one."""
    if all(getattr(r, field) is None for r in records):
        return {}
    groups: dict[str, list[RequestRecord]] = {}
    for r in records:
        groups.setdefault(getattr(r, field) or default, []).append(r)
    return groups


def _all_gaps(records: list[RequestRecord]) -> np.ndarray:
    gaps = [np.diff(r.token_times) for r in records if len(r.token_times) > 1]
    return np.concatenate(gaps) if gaps else np.zeros(0)


def _numpy_scalar(obj):
    """Lets records hold numpy numbers (a simulator's clock may be one)."""
    if isinstance(obj, np.generic):
        return obj.item()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def encode_result(result: RunResult) -> bytes:
    return msgspec.json.format(msgspec.json.encode(result, enc_hook=_numpy_scalar), indent=2)


def write_result(result: RunResult, path: str | Path) -> None:
    Path(path).write_bytes(encode_result(result) + b"\n")


def read_result(path: str | Path) -> RunResult:
    return msgspec.json.decode(Path(path).read_bytes(), type=RunResult)
