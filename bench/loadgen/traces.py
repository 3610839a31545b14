"""Traces by name: the packaged tables in bench/data/trace_data, or the raw files.

A name (TRACE_FILES) stands for `bench/data/trace_data/<name>.csv.gz`: the third-party file's
length columns and, for a trace that has them (`azure-conv`), its arrival times as seconds
from its first row (see bench/data/trace_data/README.md and bench/data/derive_traces.py).
The ASCENDRA_TRACES environment variable overrides that with a folder of the raw files
(TRACE_FILES names them). bench/loadgen/trace_file.py reads either.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "ASCENDRA_TRACES"
TRACE_DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "trace_data"
#: trace name -> the raw third-party file it comes from
TRACE_FILES = {
    "sharegpt": "sarathi_sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
    "arxiv": "vidur_arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
    "azure-conv": "AzureLLMInferenceTrace_conv.csv",
}
#: the traces whose rows carry arrival times (a run replays them unless told otherwise)
TIMED_TRACES = frozenset({"azure-conv"})
#: the packaged tables' columns: prompt and output tokens, and arrival times where known
PROMPT_COLUMN, OUTPUT_COLUMN = "num_prefill_tokens", "num_decode_tokens"
ARRIVAL_COLUMN = "arrival_time"


def trace_file(name: str) -> Path:
    """The file a trace name stands for: $ASCENDRA_TRACES/<raw file> when the variable is
    set, else the packaged `trace_data/<name>.csv.gz`."""
    if name not in TRACE_FILES:
        raise ValueError(f"unknown trace {name!r}; choose one of {sorted(TRACE_FILES)}")
    env = os.environ.get(ENV_VAR)
    path = (Path(env).expanduser() / TRACE_FILES[name] if env
            else TRACE_DATA_DIR / f"{name}.csv.gz")
    if not path.is_file():
        where = (f"{ENV_VAR} names its folder; unset it to use the packaged traces" if env
                 else f"packaged trace missing: reinstall, or set {ENV_VAR} to a folder "
                      f"of the raw files")
        raise FileNotFoundError(f"trace file {path} not found ({where})")
    return path


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
