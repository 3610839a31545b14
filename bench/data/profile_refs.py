"""The published reference numbers the GPU profiles are checked against.

They are read from the packaged `reference_data/profile_refs.json` (derived from the shared
profiles README by derive_profile_refs.py; see reference_data/README.md), or, when the
ASCENDRA_PROFILES environment variable names a raw profiles folder, parsed from that
folder's README.md. Parsing raises a ValueError naming the passage when the README no
longer has the expected shape.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec

from engines.executors.profiles.data import raw_profiles_dir

REFS_FILE = Path(__file__).resolve().with_name("reference_data") / "profile_refs.json"

#: README column header (start) of the summed-ops table -> our profile with that data.
SUMMED_OPS_COLUMNS = {
    "Llama-3-8B A100": "a100-llama3-8b",
    "Llama-2-7B A100": "a100-llama2-7b",
    "Llama-2-7B H100": "h100-llama2-7b",
    "internlm-20b A100": "a100-qwen14b",
}


class ProfileRefs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    #: profile name -> {tokens in batch: ms}, the "Sum of the 9 per-layer ops" table
    summed_ops: dict[str, dict[int, float]]
    #: (context per request, decode batch, attn_decode ms per layer), A100 Llama-3-8B
    decode_spots: list[tuple[int, int, float]]
    #: (chunk tokens, kv low, kv high, ms at low, ms at high) of one attn_prefill chunk
    prefill_chunk_range: tuple[int, int, int, float, float]
    #: [(input tokens, ms)]: TensorRT-LLM LLaMA-7B A100 FP16 batch-1 first-token latency
    trt_first_token_a100: list[tuple[int, float]]
    #: [(output tok/s, batch, input, output)]: TensorRT-LLM LLaMA-7B A100 FP16 peaks
    trt_throughput_a100: list[tuple[float, int, int, int]]


def load_refs() -> ProfileRefs:
    """From $ASCENDRA_PROFILES/README.md when the variable is set, else the packaged file."""
    raw = raw_profiles_dir()
    if raw is not None:
        return from_readme((raw / "README.md").read_text())
    if not REFS_FILE.is_file():
        raise FileNotFoundError(f"packaged reference numbers missing: {REFS_FILE} (reinstall, "
                                f"or set ASCENDRA_PROFILES to a raw profiles folder)")
    return msgspec.json.decode(REFS_FILE.read_bytes(), type=ProfileRefs)


def encode_refs(refs: ProfileRefs) -> str:
    """JSON text, one line per field or per profile (what derive_profile_refs.py writes)."""
    return _json_lines(msgspec.to_builtins(refs), "") + "\n"


def _json_lines(obj: dict, indent: str) -> str:
    """`obj` as JSON, nesting dicts of dicts over lines and anything else on one line."""
    lines = [f"{indent}  {json.dumps(key)}: "
             + (_json_lines(value, indent + "  ").lstrip() if _nests(value) else json.dumps(value))
             for key, value in obj.items()]
    return indent + "{\n" + ",\n".join(lines) + "\n" + indent + "}"


def _nests(value) -> bool:
    return isinstance(value, dict) and any(isinstance(v, dict) for v in value.values())


def from_readme(text: str) -> ProfileRefs:
    """Every reference number, parsed from the shared profiles README's text."""
    return ProfileRefs(summed_ops=summed_ops(text), decode_spots=decode_spots(text),
                       prefill_chunk_range=prefill_chunk_range(text),
                       trt_first_token_a100=trt_first_token_a100(text),
                       trt_throughput_a100=trt_throughput_a100(text))


def markdown_table(text: str, first_header: str) -> tuple[list[str], list[list[str]]]:
    """(header cells, body rows) of the first table whose header starts with `first_header`."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and _cells(line)[0] == first_header:
            rows = []
            for body in lines[i + 2:]:
                if not body.startswith("|"):
                    break
                rows.append(_cells(body))
            return _cells(line), rows
    raise ValueError(f"profiles README: no table headed {first_header!r}")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _number(cell: str) -> float | None:
    match = re.match(r"[\d.,]+", cell)
    return float(match.group().replace(",", "")) if match else None


def summed_ops(text: str) -> dict[str, dict[int, float]]:
    """profile name -> {tokens in batch: ms}, the "Sum of the 9 per-layer ops" table."""
    headers, rows = markdown_table(text, "tokens in batch")
    table: dict[str, dict[int, float]] = {}
    for col, header in enumerate(headers[1:], start=1):
        name = next((p for h, p in SUMMED_OPS_COLUMNS.items() if header.startswith(h)), None)
        if name is None:
            raise ValueError(f"profiles README: unknown summed-ops column {header!r}")
        table[name] = {int(r[0]): v for r in rows if (v := _number(r[col])) is not None}
    return table


def decode_spots(text: str) -> list[tuple[int, int, float]]:
    """(context per request, decode batch, attn_decode ms per layer), A100 Llama-3-8B."""
    _, rows = markdown_table(text, "kv_cache_size (per request)")
    return [(int(r[0]), int(r[1]), float(r[2])) for r in rows]


def _search(pattern: str, text: str, what: str) -> re.Match:
    match = re.search(pattern, text)
    if match is None:
        raise ValueError(f"profiles README: cannot find {what}")
    return match


def prefill_chunk_range(text: str) -> tuple[int, int, int, float, float]:
    """(chunk tokens, kv low, kv high, ms at low, ms at high) of the attn_prefill sentence."""
    m = _search(r"(\d+)-token chunk with `kv_cache_size` from (\d+) to (\d+) costs\s+"
                r"([\d.]+)-([\d.]+) ms/layer", text, "the prefill chunk range")
    return int(m[1]), int(m[2]), int(m[3]), float(m[4]), float(m[5])


def trt_first_token_a100(text: str) -> list[tuple[int, float]]:
    """[(input tokens, ms)] of TensorRT-LLM's LLaMA-7B A100 FP16 batch-1 first-token latency."""
    m = _search(r"A100 FP16: (\d+) ms \((\d+) input tokens\), (\d+) ms \((\d+) input tokens\)",
                text, "the TensorRT-LLM A100 first-token latencies")
    return [(int(m[2]), float(m[1])), (int(m[4]), float(m[3]))]


def trt_throughput_a100(text: str) -> list[tuple[float, int, int, int]]:
    """[(output tok/s, batch, input, output)] of TensorRT-LLM's LLaMA-7B A100 FP16 peaks."""
    found = re.findall(r"([\d,]+) output tok/s at bs (\d+) \((\d+) in / (\d+) out\)", text)
    if not found:
        raise ValueError("profiles README: cannot find the TensorRT-LLM throughput lines")
    return [(float(t.replace(",", "")), int(b), int(i), int(o)) for t, b, i, o in found]
