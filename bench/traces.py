"""Request-length traces from `../shared/traces/` (third-party data, read in place).

`load_trace("sharegpt")` gives (prompt tokens, output tokens) pairs in file order.
"""
from __future__ import annotations

import csv
import os
from pathlib import Path

TRACE_FILES = {
    "sharegpt": "sarathi_sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
    "arxiv": "vidur_arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
}


def traces_dir() -> Path:
    """$ASCENDRA_TRACES, else the `shared/traces` folder beside this checkout."""
    env = os.environ.get("ASCENDRA_TRACES")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "traces"


def load_trace(name: str) -> list[tuple[int, int]]:
    if name not in TRACE_FILES:
        raise ValueError(f"unknown trace {name!r}; choose one of {sorted(TRACE_FILES)}")
    path = traces_dir() / TRACE_FILES[name]
    if not path.exists():
        raise FileNotFoundError(f"trace file {path} not found (set ASCENDRA_TRACES to its folder)")
    with open(path, newline="") as f:
        return [(int(row["num_prefill_tokens"]), int(row["num_decode_tokens"]))
                for row in csv.DictReader(f)]


def scaled_lengths(trace: list[tuple[int, int]], n: int, scale: float, seed: int,
                   max_total: int) -> list[tuple[int, int]]:
    """`n` requests drawn from `trace` (seeded), lengths divided by `scale`, each at least 1
    token and fitting `max_total` tokens of context."""
    import random
    rng = random.Random(seed)
    picked = []
    while len(picked) < n:
        prompt, output = rng.choice(trace)
        prompt, output = max(1, round(prompt / scale)), max(1, round(output / scale))
        if prompt + output <= max_total:
            picked.append((prompt, output))
    return picked
