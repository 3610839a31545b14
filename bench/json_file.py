"""Writing a bench's result (msgspec Structs, dicts and lists of them) as a JSON file:
one format for every `--json` / `--out`, readable in a diff (indented, newline-ended)."""
from __future__ import annotations

from pathlib import Path

import msgspec


def write_json(path: str | Path, value, indent: int = 2) -> None:
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(value), indent=indent)
                           + b"\n")
