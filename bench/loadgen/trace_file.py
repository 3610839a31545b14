"""Reading a trace: its rows' prompt and output lengths and, when it has them, arrival times.

A trace is a name (`sharegpt`, `arxiv`, `azure-conv`: bench/loadgen/traces.py; read from its
packaged table or its raw file) or a CSV/JSONL file, gzip-compressed or not. Column names
are matched exactly (case matters), the first of each list that the file has:

* prompt tokens: PROMPT_COLUMNS -- ours (`num_prefill_tokens`, `prompt_tokens`),
  Mooncake's `input_length`, the Azure LLM traces' `ContextTokens`, BurstGPT's
  `Request tokens`;
* output tokens: OUTPUT_COLUMNS, likewise (`GeneratedTokens`, `Response tokens`, ...);
* arrival time: ARRIVAL_COLUMNS, each with the unit its source uses -- `arrival_time`
  (seconds, ours), BurstGPT's `Timestamp` (seconds), the Azure traces' `TIMESTAMP`
  (dates such as "2023-11-16 18:15:46.6805900"), Mooncake's `timestamp` (milliseconds).
  `arrival_column` names another column (or forces one); a named column that a row lacks
  is an error, never a reason to generate arrivals. `arrival_unit` (s, ms, us) overrides
  the unit; a value that is an ISO date is read as a date whatever the unit.

Arrival times must be on every row or on none. Only differences between them matter.

Prefix reuse: a row may name its prompt's blocks (HASH_COLUMN, the Mooncake / aiperf
`mooncake_trace` format's `hash_ids`, one id per block of BLOCK_TOKENS = 512 tokens, the
last block maybe partial). Equal ids stand for equal tokens, so a replay builds equal
blocks for them (bench/loadgen/workloads.py `hash_parts`) and reproduces the trace's
prefix reuse on the daemon's prefix cache and in the simulator alike. inference-perf's
trace-replay format is the Azure traces' CSV (TIMESTAMP, ContextTokens,
GeneratedTokens), read here as above.
"""
from __future__ import annotations

import csv
import gzip
import json
import math
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from bench.loadgen.traces import TIMED_TRACES, TRACE_FILES, trace_file

PROMPT_COLUMNS = ("num_prefill_tokens", "prompt_tokens", "input_length", "ContextTokens",
                  "Request tokens")
OUTPUT_COLUMNS = ("num_decode_tokens", "output_tokens", "output_length", "GeneratedTokens",
                  "Response tokens")
#: Arrival-time columns found without being named, in order, and the unit of each.
ARRIVAL_COLUMNS = {"arrival_time": "s", "arrived_at": "s", "Timestamp": "s", "TIMESTAMP": "s",
                   "timestamp": "ms", "timestamp_ms": "ms", "time": "s"}
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
#: A Mooncake trace's block ids, and the tokens in each block (its format's, as aiperf's).
HASH_COLUMN, BLOCK_TOKENS = "hash_ids", 512


class TraceRow(msgspec.Struct, frozen=True):
    prompt_len: int
    output_len: int
    arrival: float | None = None     # seconds, any origin
    #: The prompt's blocks of BLOCK_TOKENS tokens, by id (equal ids: equal tokens);
    #: () when the trace names none.
    hash_ids: tuple[int, ...] = ()


def load_rows(trace: str, arrival_column: str | None = None,
              arrival_unit: str | None = None) -> list[TraceRow]:
    """A built-in trace by name, or a .csv / .jsonl file.

    A file's problems are ValueErrors that name the file, the line and what is wrong.
    """
    if arrival_unit is not None and arrival_unit not in UNITS:
        raise ValueError(f"arrival unit {arrival_unit!r}: choose one of {sorted(UNITS)}")
    if trace in TRACE_FILES:
        if arrival_column is not None and trace not in TIMED_TRACES:
            raise ValueError(f"trace {trace!r} has no arrival times (column "
                             f"{arrival_column!r}); give a trace file that has them")
        return _read(trace_file(trace), arrival_column, arrival_unit)
    path = Path(trace)
    if not path.exists():
        raise FileNotFoundError(f"trace {trace!r}: not a file, nor one of {sorted(TRACE_FILES)}")
    if not path.is_file():
        raise ValueError(f"trace {path}: not a file")
    return _read(path, arrival_column, arrival_unit)


def load_trace(name: str) -> list[tuple[int, int]]:
    """(prompt, output) token pairs of a named trace, in file order."""
    return [(r.prompt_len, r.output_len) for r in _read(trace_file(name), None, None)]


def _read(path: Path, arrival_column: str | None, arrival_unit: str | None) -> list[TraceRow]:
    kind = path.suffixes[-2] if path.suffix == ".gz" and len(path.suffixes) > 1 else path.suffix
    try:
        columns, records = (_read_jsonl(path) if kind in (".jsonl", ".ndjson")
                            else _read_csv(path))
    except UnicodeDecodeError:
        raise ValueError(f"trace {path}: not a UTF-8 text file") from None
    except gzip.BadGzipFile:
        raise ValueError(f"trace {path}: not a gzip file") from None
    except csv.Error as exc:
        raise ValueError(f"trace {path}: not a readable CSV file ({exc})") from None
    if not records:
        raise ValueError(f"trace {path}: no rows")
    column = _arrival_column(path, columns, arrival_column)
    scale = UNITS[arrival_unit or ARRIVAL_COLUMNS.get(column, "s")]
    rows = [_row(record, f"trace {path} line {line}", column, scale) for line, record in records]
    untimed = [line for (line, _), row in zip(records, rows) if row.arrival is None]
    if untimed and arrival_column is not None:
        raise ValueError(f"trace {path} line {untimed[0]}: no {column} (--arrival-column)")
    if untimed and len(untimed) < len(rows):
        raise ValueError(f"trace {path} line {untimed[0]}: no {column}, but other rows have "
                         f"one; give it on every row or on none")
    return rows


def _arrival_column(path: Path, columns: list[str], named: str | None) -> str | None:
    if named is not None:
        if named not in columns:
            raise ValueError(f"trace {path}: no column {named!r} (--arrival-column); it has: "
                             f"{', '.join(columns) or 'none'}")
        return named
    return next((name for name in ARRIVAL_COLUMNS if name in columns), None)


def _read_csv(path: Path) -> tuple[list[str], list[tuple[int, dict]]]:
    """The column names and (line number, row) for each data row; column names with
    stray blanks are trimmed."""
    with _open(path) as f:
        reader = csv.DictReader(f)
        if reader.fieldnames:
            reader.fieldnames = [name.strip() for name in reader.fieldnames]
        records = [(reader.line_num, row) for row in reader]
        return list(reader.fieldnames or []), records


def _read_jsonl(path: Path) -> tuple[list[str], list[tuple[int, dict]]]:
    records, columns = [], {}
    with _open(path) as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"trace {path} line {line_no}: not JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"trace {path} line {line_no}: expected a JSON object such as "
                                 f'{{"prompt_tokens": 100, "output_tokens": 20}}, '
                                 f"got {type(record).__name__}")
            columns.update(dict.fromkeys(record))
            records.append((line_no, record))
    return list(columns), records


def _open(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    return opener(path, "rt", newline="", encoding="utf-8-sig")


def _number(where: str, name: str, value, least: float = -math.inf) -> float:
    try:
        if isinstance(value, bool):  # true/false are no numbers here
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {name} is {value!r}, not a number") from None
    if not (math.isfinite(number) and number >= least):
        bound = f" >= {least:g}" if least > -math.inf else ""
        raise ValueError(f"{where}: {name} is {value!r}; it must be a finite number{bound}")
    return number


def _time(where: str, name: str, value, scale: float) -> float:
    """Seconds: a number in the column's unit, or an ISO date (a naive one read as UTC)."""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            try:
                date = datetime.fromisoformat(value.strip())
            except ValueError:
                raise ValueError(f"{where}: {name} is {value!r}, neither a number nor a date "
                                 f"such as 2023-11-16 18:15:46.68") from None
            if date.tzinfo is None:
                date = date.replace(tzinfo=UTC)
            return date.timestamp()
    return _number(where, name, value) * scale


def _row(record: dict, where: str, arrival_column: str | None, scale: float) -> TraceRow:
    def column(names: tuple[str, ...]) -> int:
        for name in names:
            if record.get(name) not in (None, ""):
                return int(_number(where, name, record[name], least=0))
        present = ", ".join(str(k) for k in record if k is not None) or "none"
        raise ValueError(f"{where}: needs a column named one of {names} (it has: {present})")

    arrival = record.get(arrival_column) if arrival_column else None
    return TraceRow(column(PROMPT_COLUMNS), column(OUTPUT_COLUMNS),
                    None if arrival in (None, "") else _time(where, arrival_column, arrival, scale),
                    _hash_ids(where, record.get(HASH_COLUMN)))


def _hash_ids(where: str, value) -> tuple[int, ...]:
    """A row's block ids: a JSON list of integers (absent or empty: none)."""
    if value in (None, "", []):
        return ()
    if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{where}: {HASH_COLUMN} is {value!r}; it must be a list of integer "
                         f"block ids")
    return tuple(value)
