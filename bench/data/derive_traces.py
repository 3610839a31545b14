"""Derives the packaged traces (bench/data/trace_data/*.csv.gz) from the raw files.

Each raw trace (TRACE_FILES) keeps its rows, in order, and only what a run reads: prompt and
output tokens (`num_prefill_tokens`, `num_decode_tokens`) and, for a trace with arrival
times, `arrival_time`: seconds from its first row, to the microsecond. Written as
gzip-compressed CSV, byte-reproducibly (no name or time in the gzip header).

    python -m bench.data.derive_traces [RAW_DIR] [--out DIR]

RAW_DIR holds the raw files (default ../shared/traces beside the checkout); they never
enter the repository.
"""
from __future__ import annotations

from pathlib import Path

from bench.loadgen.trace_file import load_rows
from bench.loadgen.traces import (ARRIVAL_COLUMN, OUTPUT_COLUMN, PROMPT_COLUMN, TRACE_DATA_DIR,
                                  TRACE_FILES)
from engines.derived_files import derivation_main, derive_all

#: Where the raw third-party files lie beside a checkout: this derivation's default input
#: (only here: nothing that runs needs them).
RAW_DEFAULT_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


def derived_csv(raw_file: Path) -> bytes:
    """The derived table of one raw trace, as CSV text bytes (before compression)."""
    rows = load_rows(str(raw_file))
    if rows[0].arrival is None:
        lines = [f"{PROMPT_COLUMN},{OUTPUT_COLUMN}"]
        lines += [f"{r.prompt_len},{r.output_len}" for r in rows]
    else:
        first = rows[0].arrival
        lines = [f"{PROMPT_COLUMN},{OUTPUT_COLUMN},{ARRIVAL_COLUMN}"]
        lines += [f"{r.prompt_len},{r.output_len},{r.arrival - first:.6f}" for r in rows]
    return ("\n".join(lines) + "\n").encode()


def derive(raw_dir: Path, out_dir: Path) -> list[Path]:
    """Writes `<out_dir>/<name>.csv.gz` for every trace; returns their paths."""
    return derive_all(((raw_dir / filename, out_dir / f"{name}.csv.gz")
                       for name, filename in sorted(TRACE_FILES.items())),
                      derived_csv, "trace file")


def main(argv: list[str] | None = None) -> None:
    derivation_main(argv, __doc__.splitlines()[0], RAW_DEFAULT_DIR, TRACE_DATA_DIR, derive)


if __name__ == "__main__":
    main()
