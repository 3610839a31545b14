"""`ascendra records FILE`: a records file's report (bench/records/records_report.py), as tables.

FILE is what `simulate --records`, `capacity` or `bench --records` wrote. The report
prints as tables (rich's when the `bench` extra is installed, else plain text: it runs on
the base install); `--json OUT` writes it (a `RecordsReport`) too.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from bench.json_file import write_json
from bench.records.records_file import read_records
from bench.records.records_report import GroupRow, RecordsReport, cause_text, report
from bench.records.text_table import TextTable, print_blocks


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="a records file (.jsonl or .parquet)")
    p.add_argument("--json", metavar="OUT", help="write the report as JSON here")
    p.add_argument("--all", dest="measured_only", action="store_false",
                   help="count every row, the warm-up and cool-down ones too (default: the "
                        "measured rows only)")
    p.add_argument("--examples", type=int, default=3,
                   help="worst examples shown per cause of misses (default %(default)s)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.examples < 0:
        raise ValueError(f"--examples must be >= 0, got {args.examples}")
    path = Path(args.file)
    if not path.is_file():
        raise FileNotFoundError(f"records {path}: not a file")
    result = report(read_records(path), str(path), measured_only=args.measured_only,
                    examples=args.examples)
    print_report(result)
    if args.json:
        write_json(args.json, result)
    return 0


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f}"


def _x(multiple: float | None) -> str:
    return "-" if multiple is None else f"{multiple:.1f}x"


def print_report(result: RecordsReport, file=None) -> None:
    """The report as text lines and tables (bench/records/text_table.py: rich's when installed)."""
    left = (f", {result.left_out} outside the steady-state window left out"
            if result.left_out else "")
    blocks: list[str | TextTable] = [
        f"{result.file}: {result.requests} requests{left}",
        f"goodput {result.goodput_pct:.1f} % ({result.good} met their targets); "
        f"token goodput {result.token_goodput_pct:.1f} % of prompt + output tokens",
        f"p99 TTFT of completed requests {_s(result.p99_ttft_s)} s; longest wait "
        f"for a first answer {_x(result.max_wait_slo_multiple)} its TTFT target"]
    for title, groups in (("by SLO class", result.by_class), ("by tenant", result.by_tenant),
                          ("by prompt length (tokens)", result.by_prompt_len),
                          ("by prompt-length quartile (tokens)", result.by_prompt_quartile),
                          ("by instance (the last that held it)", result.by_instance),
                          ("offloaded or not", result.by_offload)):
        if groups or title != "by tenant":
            blocks.append(_group_table(title, groups))
    if not result.misses:  # an empty table would read as a report that lacks them
        blocks.append("misses by cause: none -- every request reported met its targets")
    else:
        blocks.append(TextTable("misses by cause", ("cause", "requests", "% of misses"),
                                [(cause_text(m.cause), str(m.count), f"{m.share_pct:.1f}")
                                 for m in result.misses]))
    if result.misses and result.worst:
        blocks.append(TextTable(
            "worst examples (seconds)",
            ("cause", "index", "prompt", "ttft", "queue", "mean tbt", "targets", "instances",
             "code"),
            [(cause_text(w.cause), str(w.index), str(w.prompt_tokens), _s(w.ttft),
              _s(w.queue_delay), _s(w.mean_tbt), f"{w.ttft_slo:g} / {w.tbt_slo:g}",
              " ".join(map(str, w.instances)) or "-", w.error_code or "-")
             for w in result.worst]))
    print_blocks(blocks, file)


def _group_table(title: str, groups: list[GroupRow]) -> TextTable:
    return TextTable(f"goodput {title}",
                     ("group", "requests", "good", "goodput %", "completed", "dropped",
                      "errored", "lost", "p99 TTFT s"),
                     [(g.group, str(g.requests), str(g.good), f"{g.goodput_pct:.1f}",
                       str(g.completed), str(g.dropped), str(g.errored), str(g.lost),
                       _s(g.p99_ttft_s)) for g in groups])
