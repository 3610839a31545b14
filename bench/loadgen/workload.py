"""The requests of one load-test run: when each arrives and how long its prompt and output are.

A trace (bench/loadgen/trace_file.py reads it) is `sharegpt`, `arxiv` or a CSV/JSONL file of
prompt and output token counts. `build_workload` is the plain form: a file with arrival
times is replayed in time order from the first (the rate is then ignored); otherwise
requests are sampled from the trace with a seed and arrive as bench/loadgen/arrivals.py draws
them. Named workloads (bursty, on/off, mixed SLOs, replay at a rate) are
bench/loadgen/workloads.py.

Lengths (`fit_lengths`): divided by `length_scale`, the prompt trimmed to
`max_prompt_len`, then both fitted into `max_model_len` (`clamp`: the output is kept when
it fits, the prompt is cut; both stay at least 1 token).

Prompts are token-id lists of the trace's length with random ids in [3, 256): every
vocabulary has those, and a load test does not care what the text says. A request of a
workload with reuse (bench/loadgen/reuse_workloads.py) names its prompt's parts instead: equal
parts are equal tokens, so a shared system prompt or a conversation's history is the
same text in every request that has it (`request_prompt`).
"""
from __future__ import annotations

import msgspec
import numpy as np

from bench.loadgen.arrivals import arrival_offsets, arrivals_within
from bench.loadgen.trace_file import TraceRow, load_rows

__all__ = ["HIGH_TOKEN_ID", "LOW_TOKEN_ID", "PromptPart", "TraceRow", "WorkloadRequest",
           "build_workload", "clamp", "fit_lengths", "load_rows", "prompt_token_ids",
           "request_prompt", "sample_rows"]

#: Prompt token ids are drawn from [LOW_TOKEN_ID, HIGH_TOKEN_ID).
LOW_TOKEN_ID, HIGH_TOKEN_ID = 3, 256


class PromptPart(msgspec.Struct, frozen=True, array_like=True):
    """`length` tokens named by `key`: the same key gives the same tokens (for one seed)."""
    key: tuple[int, ...]
    length: int


class WorkloadRequest(msgspec.Struct, frozen=True):
    index: int
    arrival: float       # seconds from the start of the run
    prompt_len: int
    output_len: int      # sent as max_tokens, with ignore_eos
    #: Its own targets, seconds (sent with the request); None = the server's defaults.
    ttft_slo: float | None = None
    tbt_slo: float | None = None
    slo_class: str | None = None     # the SLO class they come from (bench/loadgen/workloads.py)
    #: The prompt as named parts, their lengths summing to `prompt_len`; () = a prompt of
    #: its own (bench/loadgen/reuse_workloads.py).
    prompt_parts: tuple[PromptPart, ...] = ()
    #: Sent first to bring the server to steady state (the earlier turns of conversations
    #: in progress when the run starts, priming the prefix cache); never measured.
    warmup: bool = False
    #: Who sends it (bench/loadgen/tenant_mix.py); None = no tenant named (the server's
    #: "default").
    tenant: str | None = None
    priority: int = 0    # its tenant's; < 0: sheddable
    #: The served model it asks for ("" = the server's first): a multiplexed box's
    #: requests name theirs (bench/studies/multi_model.py).
    model: str = ""


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
        rows = sample_rows(rows, len(arrivals), seed)
    return [WorkloadRequest(i, float(arrival),
                            *fit_lengths(row, length_scale, None, max_model_len))
            for i, (arrival, row) in enumerate(zip(arrivals, rows))]


def fit_lengths(row: TraceRow, length_scale: float, max_prompt_len: int | None,
                max_model_len: int | None) -> tuple[int, int]:
    """A row's (prompt, output) lengths as a run sends them (see the module's docstring)."""
    prompt, output = (max(1, round(n / length_scale)) for n in (row.prompt_len, row.output_len))
    if max_prompt_len is not None:
        prompt = min(prompt, max_prompt_len)
    return clamp(prompt, output, max_model_len)


def sample_rows(rows: list[TraceRow], n: int, seed: int) -> list[TraceRow]:
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


def request_prompt(request: WorkloadRequest, seed: int) -> list[int]:
    """The prompt a run sends for `request`: its named parts, or one of its own."""
    if not request.prompt_parts:
        return prompt_token_ids(seed, request.index, request.prompt_len)
    tokens: list[int] = []
    for part in request.prompt_parts:
        rng = np.random.default_rng([seed, 3, *part.key])
        tokens += rng.integers(LOW_TOKEN_ID, HIGH_TOKEN_ID, size=part.length).tolist()
    return tokens
