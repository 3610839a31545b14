"""What a records file says: goodput by group, and which requests missed and why.

`report(rows)` summarises the `RecordRow`s of a `--records` file (bench/records/records_file.py):
goodput (a row's `met_slo`, as the run counted it) and token goodput (prompt + output
tokens of the good rows over all), by SLO class, by tenant (when the rows carry tenants:
a workload with a tenant mix), by prompt length (PROMPT_BUCKETS, and
the quartiles of the rows' own prompt lengths, as the capacity ruler's classes:
bench/records/request_classes.py), by the instance that held it last and by offloaded or not; then every
miss under one cause, the first that applies:

* `dropped:CODE` -- the server gave up on it (CODE: its error code, e.g. ttft_slo_missed);
* `errored:CODE` -- any other failure (CODE `none` when it had no code);
* `lost`         -- no answer before the run ended;
* `ttft_queued`  -- TTFT over its target, and its wait before prefill (`queue_delay`)
  alone was over the target: it was lost in the queue;
* `ttft`         -- TTFT over its target otherwise (prefill or moves too slow; or a live
  run against a server that reports no queue delay -- Ascendra does: `serving_info`);
* `tbt`          -- TTFT met, mean TBT over its target;
* `other`        -- counted a miss for none of these reasons (should not happen).

The worst examples of each cause are those furthest over their target (failures: in
arrival order). By default only the measured rows (the steady-state window) count.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec
import numpy as np

from bench.records.schema import RecordRow
from bench.records.request_classes import RequestClasses

#: (upper bound, exclusive; label) of the prompt-length buckets, tokens.
PROMPT_BUCKETS = ((512, "<512"), (2048, "512-2047"), (4096, "2048-4095"), (None, ">=4096"))
CAUSE_TEXT = {"ttft_queued": "TTFT missed while queued", "ttft": "TTFT missed",
              "tbt": "TBT missed", "lost": "lost (no answer)", "other": "other"}


class GroupRow(msgspec.Struct, kw_only=True):
    group: str
    requests: int
    good: int
    goodput_pct: float
    completed: int
    dropped: int
    errored: int
    lost: int
    p99_ttft_s: float | None           # over its completed requests


class MissCount(msgspec.Struct, kw_only=True):
    cause: str
    count: int
    share_pct: float                   # of all misses


class MissExample(msgspec.Struct, kw_only=True):
    cause: str
    index: int
    prompt_tokens: int
    ttft: float | None
    mean_tbt: float | None
    queue_delay: float | None
    ttft_slo: float
    tbt_slo: float
    instances: list[int]
    error_code: str | None


class RecordsReport(msgspec.Struct, kw_only=True):
    file: str
    requests: int                      # the rows reported
    left_out: int                      # rows outside the steady-state window, not reported
    good: int
    goodput_pct: float
    token_goodput_pct: float
    by_class: list[GroupRow]
    #: By tenant; empty when no row names one.
    by_tenant: list[GroupRow] = []
    by_prompt_len: list[GroupRow]
    by_prompt_quartile: list[GroupRow]
    by_instance: list[GroupRow]
    by_offload: list[GroupRow]
    p99_ttft_s: float | None           # over the completed requests
    #: The longest any request waited for its first answer (first token, or the terminal
    #: answer of one that got none), in multiples of its own TTFT target: starvation.
    max_wait_slo_multiple: float | None
    misses: list[MissCount]            # commonest first
    worst: list[MissExample]           # per cause, worst first


def report(rows: Sequence[RecordRow], file: str = "", *, measured_only: bool = True,
           examples: int = 3) -> RecordsReport:
    kept = [r for r in rows if r.measured or not measured_only]
    good = sum(r.met_slo for r in kept)
    missed = [r for r in kept if not r.met_slo]
    causes: dict[str, list[RecordRow]] = {}
    for r in missed:
        causes.setdefault(cause(r), []).append(r)
    order = sorted(causes, key=lambda c: (-len(causes[c]), c))
    tokens = sum(r.prompt_tokens + r.max_tokens for r in kept)
    quartiles = RequestClasses.from_prompts([r.prompt_tokens for r in kept] or [0])
    labels = quartiles.prompt_labels()
    return RecordsReport(
        file=file, requests=len(kept), left_out=len(rows) - len(kept), good=good,
        goodput_pct=_pct(good, len(kept)),
        token_goodput_pct=_pct(sum(r.prompt_tokens + r.max_tokens for r in kept if r.met_slo),
                               tokens),
        by_class=_groups(kept, lambda r: r.slo_class or "default"),
        by_tenant=(_groups(kept, lambda r: r.tenant or "default")
                   if any(r.tenant is not None for r in rows) else []),
        by_prompt_len=_groups(kept, prompt_bucket, [label for _, label in PROMPT_BUCKETS]),
        by_prompt_quartile=_groups(kept, lambda r: labels[quartiles.prompt_class(r.prompt_tokens)],
                                   labels),
        by_instance=_groups(kept, lambda r: str(r.instances[-1]) if r.instances else "none",
                            key=lambda g: (g == "none", int(g) if g.isdigit() else 0, g)),
        by_offload=_groups(kept, lambda r: "offloaded" if r.offloaded else "not offloaded",
                           ["not offloaded", "offloaded"]),
        p99_ttft_s=_p99([r.ttft for r in kept if r.outcome == "completed"]),
        max_wait_slo_multiple=max((r.answer_wait / r.ttft_slo for r in kept
                                   if r.answer_wait is not None), default=None),
        misses=[MissCount(cause=c, count=len(causes[c]), share_pct=_pct(len(causes[c]),
                                                                         len(missed)))
                for c in order],
        worst=[_example(c, r) for c in order for r in _worst(causes[c])[:examples]])


def cause(row: RecordRow) -> str:
    """Why a row missed its targets (the module docstring lists the causes)."""
    if row.outcome in ("dropped", "errored"):
        return f"{row.outcome}:{row.error_code or 'none'}"
    if row.outcome == "lost":
        return "lost"
    if row.ttft is not None and row.ttft > row.ttft_slo:
        queued = row.queue_delay is not None and row.queue_delay > row.ttft_slo
        return "ttft_queued" if queued else "ttft"
    if row.mean_tbt is not None and row.mean_tbt > row.tbt_slo:
        return "tbt"
    return "other"


def cause_text(name: str) -> str:
    kind, _, code = name.partition(":")
    return f"{kind} ({code})" if code else CAUSE_TEXT.get(name, name)


def prompt_bucket(row: RecordRow) -> str:
    return next(label for bound, label in PROMPT_BUCKETS
                if bound is None or row.prompt_tokens < bound)


def _pct(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 0.0


def _p99(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.percentile(present, 99)) if present else None


def _groups(rows: Sequence[RecordRow], group_of: Callable[[RecordRow], str],
            order: Sequence[str] | None = None, key=None) -> list[GroupRow]:
    """One row per group that has requests: in `order`, else sorted (by `key`)."""
    groups: dict[str, list[RecordRow]] = {}
    for r in rows:
        groups.setdefault(group_of(r), []).append(r)
    names = ([g for g in order if g in groups] if order is not None
             else sorted(groups, key=key))
    result = []
    for name in names:
        members = groups[name]
        good = sum(r.met_slo for r in members)
        counts = {o: sum(r.outcome == o for r in members)
                  for o in ("completed", "dropped", "errored", "lost")}
        result.append(GroupRow(group=name, requests=len(members), good=good,
                               goodput_pct=_pct(good, len(members)), **counts,
                               p99_ttft_s=_p99([r.ttft for r in members
                                                if r.outcome == "completed"])))
    return result


def _worst(rows: list[RecordRow]) -> list[RecordRow]:
    def overshoot(r: RecordRow) -> float:
        ratios = [r.ttft / r.ttft_slo if r.ttft is not None else 0.0,
                  r.mean_tbt / r.tbt_slo if r.mean_tbt is not None else 0.0]
        return max(ratios)

    if rows and rows[0].outcome == "completed":
        return sorted(rows, key=lambda r: (-overshoot(r), r.index))
    return sorted(rows, key=lambda r: (r.arrival, r.index))


def _example(name: str, r: RecordRow) -> MissExample:
    return MissExample(cause=name, index=r.index, prompt_tokens=r.prompt_tokens, ttft=r.ttft,
                       mean_tbt=r.mean_tbt, queue_delay=r.queue_delay, ttft_slo=r.ttft_slo,
                       tbt_slo=r.tbt_slo, instances=list(r.instances), error_code=r.error_code)
