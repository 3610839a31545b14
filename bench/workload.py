"""The requests of one load-test run: when each arrives and how long its prompt and output are.

A trace is `sharegpt` or `arxiv` (see bench/traces.py) or a CSV/JSONL file with prompt
and output token counts, in columns named `num_prefill_tokens`/`num_decode_tokens` or
`prompt_tokens`/`output_tokens`. A file may also have `arrival_time` (seconds): then
its rows are replayed in time order from the first and no arrivals are generated
(the rate is then ignored); it must be on every row or on none.
Otherwise requests are sampled from the trace with a seed and arrive as bench/arrivals.py
draws them.

Prompts are token-id lists of the trace's length with random ids in [3, 256): every
vocabulary has those, and a load test does not care what the text says.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import msgspec
import numpy as np

from bench.arrivals import arrival_offsets, arrivals_within
from bench.traces import TRACE_FILES, load_trace

PROMPT_COLUMNS = ("num_prefill_tokens", "prompt_tokens")
OUTPUT_COLUMNS = ("num_decode_tokens", "output_tokens")
ARRIVAL_COLUMN = "arrival_time"
#: Prompt token ids are drawn from [LOW_TOKEN_ID, HIGH_TOKEN_ID).
LOW_TOKEN_ID, HIGH_TOKEN_ID = 3, 256


class WorkloadRequest(msgspec.Struct, frozen=True):
    index: int
    arrival: float       # seconds from the start of the run
    prompt_len: int
    output_len: int      # sent as max_tokens, with ignore_eos


class TraceRow(msgspec.Struct, frozen=True):
    prompt_len: int
    output_len: int
    arrival: float | None = None


def load_rows(trace: str) -> list[TraceRow]:
    """A built-in trace by name, or a .csv / .jsonl file.

    A file's problems are ValueErrors that name the file, the line and what is wrong.
    """
    if trace in TRACE_FILES:
        return [TraceRow(p, o) for p, o in load_trace(trace)]
    path = Path(trace)
    if not path.exists():
        raise FileNotFoundError(f"trace {trace!r}: not a file, nor one of {sorted(TRACE_FILES)}")
    if not path.is_file():
        raise ValueError(f"trace {path}: not a file")
    try:
        records = _read_jsonl(path) if path.suffix in (".jsonl", ".ndjson") else _read_csv(path)
    except UnicodeDecodeError:
        raise ValueError(f"trace {path}: not a UTF-8 text file") from None
    except csv.Error as exc:
        raise ValueError(f"trace {path}: not a readable CSV file ({exc})") from None
    rows = [_row(record, path, line) for line, record in records]
    if not rows:
        raise ValueError(f"trace {path}: no rows")
    untimed = [line for (line, _), row in zip(records, rows) if row.arrival is None]
    if untimed and len(untimed) < len(rows):
        raise ValueError(f"trace {path} line {untimed[0]}: no {ARRIVAL_COLUMN}, but other rows "
                         f"have one; give it on every row or on none")
    return rows


def _read_csv(path: Path) -> list[tuple[int, dict]]:
    """(line number, row) for each data row; column names with stray blanks are trimmed."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames:
            reader.fieldnames = [name.strip() for name in reader.fieldnames]
        return [(reader.line_num, row) for row in reader]


def _read_jsonl(path: Path) -> list[tuple[int, dict]]:
    records = []
    with open(path, encoding="utf-8-sig") as f:
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
            records.append((line_no, record))
    return records


def _row(record: dict, path: Path, line: int) -> TraceRow:
    where = f"trace {path} line {line}"

    def number(name: str, value, least: float = -math.inf) -> float:
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

    def column(names: tuple[str, ...]) -> int:
        for name in names:
            if record.get(name) not in (None, ""):
                return int(number(name, record[name], least=0))
        present = ", ".join(str(k) for k in record if k is not None) or "none"
        raise ValueError(f"{where}: needs a column named one of {names} (it has: {present})")

    arrival = record.get(ARRIVAL_COLUMN)
    return TraceRow(column(PROMPT_COLUMNS), column(OUTPUT_COLUMNS),
                    None if arrival in (None, "") else number(ARRIVAL_COLUMN, arrival))


def clamp(prompt_len: int, output_len: int, max_model_len: int | None) -> tuple[int, int]:
    """Fit prompt + output into `max_model_len` tokens: output is kept when it can be
    (below the limit), the prompt is cut; both stay at least 1."""
    prompt_len, output_len = max(1, prompt_len), max(1, output_len)
    if max_model_len is None or prompt_len + output_len <= max_model_len:
        return prompt_len, output_len
    if max_model_len < 2:
        raise ValueError(f"max_model_len {max_model_len} leaves no room for a prompt and an output")
    output_len = min(output_len, max_model_len - 1)
    return min(prompt_len, max_model_len - output_len), output_len


def build_workload(trace: str | list[TraceRow], *, rate: float = float("inf"),
                   burstiness: float = 1.0, num_requests: int | None = None,
                   duration: float | None = None, seed: int = 0,
                   max_model_len: int | None = None, length_scale: float = 1.0,
                   ) -> list[WorkloadRequest]:
    """`num_requests` requests, or every arrival within `duration` seconds.

    `length_scale` divides both lengths (e.g. 4 to shrink a trace for a small model);
    `max_model_len` then clamps them (see `clamp`).
    """
    if (num_requests is None) == (duration is None):
        raise ValueError("give exactly one of num_requests and duration")
    if length_scale <= 0:
        raise ValueError(f"length_scale must be > 0, got {length_scale}")
    rows = load_rows(trace) if isinstance(trace, str) else list(trace)
    if rows and all(r.arrival is not None for r in rows):
        arrivals, rows = _replayed(rows, num_requests, duration)
    else:
        arrivals = (arrival_offsets(num_requests, rate, burstiness, seed) if num_requests is not None
                    else arrivals_within(duration, rate, burstiness, seed))
        rows = _sampled(rows, len(arrivals), seed)
    requests = []
    for i, (arrival, row) in enumerate(zip(arrivals, rows)):
        prompt, output = (max(1, round(n / length_scale)) for n in (row.prompt_len, row.output_len))
        prompt, output = clamp(prompt, output, max_model_len)
        requests.append(WorkloadRequest(i, float(arrival), prompt, output))
    return requests


def _sampled(rows: list[TraceRow], n: int, seed: int) -> list[TraceRow]:
    """`n` rows drawn at random: without replacement while the trace has enough."""
    rng = np.random.default_rng([seed, 1])  # a stream apart from the arrivals'
    picks = rng.choice(len(rows), size=n, replace=n > len(rows))
    return [rows[i] for i in picks]


def _replayed(rows: list[TraceRow], num_requests: int | None, duration: float | None):
    rows = sorted(rows, key=lambda r: r.arrival)
    start = rows[0].arrival
    if duration is not None:
        rows = [r for r in rows if r.arrival - start < duration]
    elif num_requests > len(rows):
        raise ValueError(f"the trace has {len(rows)} timed rows; {num_requests} were asked for")
    else:
        rows = rows[:num_requests]
    return [r.arrival - start for r in rows], rows


def prompt_token_ids(seed: int, index: int, length: int) -> list[int]:
    """The prompt of request `index`: made when it is sent, so a long run holds no prompts."""
    rng = np.random.default_rng([seed, 2, index])
    return rng.integers(LOW_TOKEN_ID, HIGH_TOKEN_ID, size=length).tolist()
