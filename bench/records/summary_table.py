"""The table a run prints at its end: with `rich` when it is installed, else plain text."""
from __future__ import annotations

import sys

from bench.records.schema import Percentiles, RunResult

LATENCIES = (("TTFT", "ttft_s"), ("TBT (every gap)", "tbt_s"), ("mean TBT per request", "mean_tbt_s"),
             ("scheduling delay", "sched_delay_s"))


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def summary_rows(result: RunResult) -> list[tuple[str, str]]:
    """(label, value) pairs: the run, its counts, goodput and rates."""
    r = result
    requests = str(r.num_requests) + (f" (after {r.primed} warm-up, not counted)"
                                      if r.primed else "")
    rows = [("requests", requests), ("duration", f"{r.duration_s:.2f} s"),
            ("SLOs (TTFT / TBT)", f"{r.ttft_slo_s:g} s / {r.tbt_slo_s:g} s"),
            ("completed / dropped / errored / lost",
             f"{r.completed} / {r.dropped} / {r.errored} / {r.lost}"),
            ("offloaded", str(r.offloaded)),
            ("goodput", f"{r.goodput_pct:.1f} % ({r.good} requests)"),
            ("token goodput", f"{r.token_goodput_pct:.1f} % of prompt + output tokens"),
            ("offered rate", f"{r.offered_rps:.2f} req/s over {r.arrival_window_s:.1f} s of "
                             "arrivals"),
            ("achieved rate", f"{r.achieved_rps:.2f} req/s completed within the arrivals"),
            ("drain", f"{r.drain_s:.1f} s after the last arrival"),
            ("over the whole run", f"{r.throughput_rps:.2f} req/s completed, "
                                   f"{r.goodput_rps:.2f} req/s good, {r.output_tok_s:.1f} "
                                   "output tok/s (drain included)"),
            ("P99 TBT", f"{_ms(r.p99_tbt_s)} ms")]
    if r.perf_model_mape is not None:
        rows.append(("perf model MAPE", f"{100 * r.perf_model_mape:.1f} %"))  # a fraction
    if r.prompt_cached_pct:
        rows.append(("prompt tokens cached", f"{r.prompt_cached_pct:.1f} %"))
    return rows


def class_rows(result: RunResult) -> list[tuple[str, str, str]]:
    """(class, targets, goodput) per SLO class; none unless the run has several classes."""
    if len(result.per_class) < 2:
        return []
    return [(c.slo_class, f"{c.ttft_slo_s:g} s / {c.tbt_slo_s:g} s",
             f"{c.goodput_pct:.1f} % ({c.good} of {c.num_requests})") for c in result.per_class]


TENANT_COLUMNS = ("tenant", "priority", "requests", "good", "goodput %", "token goodput %",
                  "served tokens", "dropped", "p99 TTFT ms")


def tenant_rows(result: RunResult) -> list[tuple[str, ...]]:
    """One row per tenant (TENANT_COLUMNS; a priority < 0 is sheddable); none unless the
    requests carry tenants."""
    return [(t.tenant, str(t.priority), str(t.num_requests), str(t.good),
             f"{t.goodput_pct:.1f}", f"{t.token_goodput_pct:.1f}", str(t.served_tokens),
             str(t.dropped), _ms(t.p99_ttft_s)) for t in result.per_tenant]


def latency_rows(result: RunResult) -> list[tuple[str, str, str, str, str]]:
    """(metric, mean, p50, p90, p99) in milliseconds."""
    rows = []
    for label, field in LATENCIES:
        p: Percentiles = getattr(result, field)
        rows.append((label, _ms(p.mean), _ms(p.p50), _ms(p.p90), _ms(p.p99)))
    return rows


def plain_summary(result: RunResult) -> str:
    lines = ["=" * 22 + " Ascendra benchmark result " + "=" * 22]
    lines += [f"{label:<38} {value}" for label, value in summary_rows(result)]
    lines.append(f"{'latency (ms)':<22}{'mean':>12}{'p50':>12}{'p90':>12}{'p99':>12}")
    lines += [f"{row[0]:<22}" + "".join(f"{v:>12}" for v in row[1:]) for row in latency_rows(result)]
    lines += [f"instance {i.get('id', '?')} ({i.get('role', '?')}): " + _instance_text(i)
              for i in result.per_instance]
    lines += [f"class {name} (TTFT / TBT {targets}): goodput {goodput}"
              for name, targets, goodput in class_rows(result)]
    tenants = tenant_rows(result)
    if tenants:
        widths = [max(len(c), *(len(row[i]) for row in tenants))
                  for i, c in enumerate(TENANT_COLUMNS)]
        lines.append("per tenant (priority < 0: sheddable):")
        lines += ["  " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                                   for i, (cell, w) in enumerate(zip(row, widths)))
                  for row in [TENANT_COLUMNS, *tenants]]
    lines.append("=" * 71)
    return "\n".join(lines)


def _instance_text(instance: dict) -> str:
    keys = ("state", "served", "offloaded", "preemptions", "perf_model_mape", "restarts",
            "lp_s", "hp_s")
    text = ", ".join(_instance_field(k, instance[k]) for k in keys if k in instance) or "-"
    changes = instance.get("role_changes")
    return text + "".join(f"; {c}" for c in changes) if changes else text


def _instance_field(key: str, value) -> str:
    """One per-instance field as the summary's other rows write it (the model's error as
    a percentage, like the run's "perf model MAPE" row; none: "-")."""
    if key == "perf_model_mape":
        return "perf model MAPE " + ("-" if value is None else f"{100 * value:.1f} %")
    return f"{key} {value}"


def print_summary(result: RunResult, file=None) -> None:
    """Print the summary (rich tables on a terminal when rich is installed)."""
    file = file or sys.stdout
    try:
        from rich.console import Console
    except ImportError:
        print(plain_summary(result), file=file)
        return
    Console(file=file, width=100).print(*_rich_tables(result))


def _rich_tables(result: RunResult):
    from rich.table import Table
    head = Table(title="Ascendra benchmark result", show_header=False)
    head.add_column("metric", style="bold")
    head.add_column("value")
    for row in summary_rows(result):
        head.add_row(*row)
    lat = Table(title="latency (ms)")
    for name in ("metric", "mean", "p50", "p90", "p99"):
        lat.add_column(name, justify="left" if name == "metric" else "right")
    for row in latency_rows(result):
        lat.add_row(*row)
    tables = [head, lat]
    if result.per_instance:
        inst = Table(title="instances (counts of this run)", show_header=False)
        for i in result.per_instance:
            inst.add_row(f"{i.get('id', '?')} ({i.get('role', '?')})", _instance_text(i))
        tables.append(inst)
    if class_rows(result):
        classes = Table(title="goodput by SLO class")
        for name in ("class", "TTFT / TBT target", "goodput"):
            classes.add_column(name)
        for row in class_rows(result):
            classes.add_row(*row)
        tables.append(classes)
    if result.per_tenant:
        tenants = Table(title="per tenant (priority < 0: sheddable)")
        for name in TENANT_COLUMNS:
            tenants.add_column(name, justify="left" if name == "tenant" else "right")
        for row in tenant_rows(result):
            tenants.add_row(*row)
        tables.append(tenants)
    return tables
