"""Per-request records files (`--records FILE`): one `RecordRow` per request, JSON lines,
or Parquet when the name ends in .parquet and pyarrow is installed.

Written by `simulate`, `capacity` (the point at capacity) and `bench`; read back, with
strict validation, by `ascendra records FILE` (bench/records/records_report.py) or any tool.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import msgspec

from bench.records.schema import RecordRow, RequestRecord
from bench.records.results import is_good


def record_rows(records: Sequence[RequestRecord], ttft_slo: float, tbt_slo: float,
                measured: Iterable[RequestRecord] | None = None) -> list[RecordRow]:
    """Rows in arrival order; `measured` (default: all) marks the steady-state ones -- never
    a warm-up request's (sent only to prime the server)."""
    kept = None if measured is None else {id(r) for r in measured}
    rows = []
    for r in sorted(records, key=lambda r: (r.arrival, r.index)):
        rows.append(RecordRow(
            index=r.index, arrival=r.arrival, prompt_tokens=r.prompt_len,
            output_tokens=r.output_tokens(), max_tokens=r.output_len, slo_class=r.slo_class,
            ttft_slo=r.ttft_slo if r.ttft_slo is not None else ttft_slo,
            tbt_slo=r.tbt_slo if r.tbt_slo is not None else tbt_slo,
            outcome=r.outcome, met_slo=is_good(r, ttft_slo, tbt_slo),
            instances=list(r.instances or ([r.instance] if r.instance is not None else [])),
            offloaded=r.offloaded, queue_delay=r.sched_delay, ttft=r.ttft(),
            mean_tbt=r.mean_tbt(), max_tbt=r.max_tbt(), finish_reason=r.finish_reason,
            error_code=r.error_code, measured=not r.warmup and (kept is None or id(r) in kept),
            answer_wait=r.answer_wait(), cached_tokens=r.cached_tokens, role=r.role,
            tenant=r.tenant))
    return rows


def write_records(path: str | Path, rows: Sequence[RecordRow]) -> None:
    path = Path(path)
    if path.suffix == ".parquet":
        _write_parquet(path, rows)
        return
    encoder = msgspec.json.Encoder()
    with path.open("wb") as f:
        for row in rows:
            f.write(encoder.encode(row) + b"\n")


def read_records(path: str | Path) -> list[RecordRow]:
    """Every row; ValueError naming the line when one does not match the schema."""
    path = Path(path)
    if path.suffix == ".parquet":
        return _read_parquet(path)
    decoder = msgspec.json.Decoder(RecordRow)
    rows = []
    with path.open("rb") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                try:
                    rows.append(decoder.decode(line))
                except msgspec.DecodeError as exc:
                    raise ValueError(f"records {path} line {number}: {exc}") from None
    return rows


def _pyarrow():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError("Parquet records need pyarrow (pip install pyarrow); "
                         "or name the file .jsonl") from None
    return pq


def _write_parquet(path: Path, rows: Sequence[RecordRow]) -> None:
    import pyarrow as pa
    pq = _pyarrow()
    pq.write_table(pa.Table.from_pylist(msgspec.to_builtins(list(rows))), path)


def _read_parquet(path: Path) -> list[RecordRow]:
    pq = _pyarrow()
    return msgspec.convert(pq.read_table(path).to_pylist(), list[RecordRow])
