"""The data of a run, shared by `ascendra bench` (a real server) and the simulator.

A `RequestRecord` is what happened to one request; `RunResult` is what a run reports
(bench/records/results.py computes it from the records). Both tools write the same JSON, so a
report reads either alike.

Times in a record are seconds on one clock with any origin (the load generator uses
seconds since its start; a simulator its virtual clock): only differences matter.
"""
from __future__ import annotations

from typing import Literal

import msgspec

from ipc.api_codes import SHED_CODES

Outcome = Literal["completed", "dropped", "errored", "lost"]
OUTCOMES: tuple[Outcome, ...] = ("completed", "dropped", "errored", "lost")
SCHEMA_VERSION = 1


class RequestRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One request, from its arrival to its terminal answer (or none: `lost`).

    completed: it ended with a finish reason. dropped: the server shed it under load
    before its first token (`failure_outcome`: it would miss its TTFT target, or the
    waiting room was full). errored: any other failure. lost: no terminal answer before
    the run ended.

    Where it ran (`instance`, `instances`, `offloaded`, `role`, `sched_delay`): a
    simulator's from the controller core's actions; a live client's from the daemon's
    `serving_info` (ipc/serving_info.py), which the same core fills.
    """
    index: int
    arrival: float                      # when it reached the server (the client sent it)
    prompt_len: int
    output_len: int                     # output tokens asked for (the trace's length)
    outcome: Outcome = "lost"
    first_token_time: float | None = None
    #: When each output token arrived; the first is `first_token_time`. A simulator
    #: gives one time per token; a streaming client one per chunk it received (see
    #: `num_output_tokens`).
    token_times: list[float] = []
    #: Output tokens generated, when it differs from len(token_times) (a client that
    #: got several tokens in one chunk learns the count from the final usage chunk).
    num_output_tokens: int | None = None
    end_time: float | None = None       # the terminal answer (finish, drop or error)
    offloaded: bool = False             # moved from an LP to an HP instance
    instance: int | None = None         # the instance that served it (last one)
    instances: list[int] = []           # every instance that held it, in order
    #: Arrival -> its prefill started on an instance (live: as the daemon saw both).
    sched_delay: float | None = None
    model: str = ""                     # the served model it asked for ("" = the first)
    ttft_slo: float | None = None       # this request's targets when not the run's
    tbt_slo: float | None = None
    slo_class: str | None = None        # its SLO class in a mixed-SLO workload
    warmup: bool = False                # sent to prime the server; never measured
    finish_reason: str | None = None
    error: str | None = None            # message of a drop or error
    #: OpenAI's error `code`; for an HTTP error without one, its `type` (e.g.
    #: invalid_request_error for a 400).
    error_code: str | None = None
    http_status: int | None = None      # a live request answered with an HTTP error
    #: The instances of its ESP group, the master first (prefilled over them); [] alone.
    esp_group: list[int] = []
    scheduled: float | None = None      # when an open-loop client meant to send it
    #: Prompt tokens its instance found in its prefix cache (OpenAI's
    #: usage.prompt_tokens_details.cached_tokens).
    cached_tokens: int = 0
    #: The role ("lp", "hp") its instance held when it gave its first token, in a layout
    #: whose roles change online (`<n>A`); None elsewhere.
    role: str | None = None
    #: Who sent it (bench/loadgen/tenant_mix.py); None: a workload without tenants.
    tenant: str | None = None
    priority: int = 0                   # as sent; < 0: sheddable

    def output_tokens(self) -> int:
        return self.num_output_tokens if self.num_output_tokens is not None else len(self.token_times)

    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival

    def mean_tbt(self) -> float | None:
        """(last token - first token) / (tokens - 1); None with fewer than 2 tokens."""
        n = self.output_tokens()
        if n < 2 or self.first_token_time is None or not self.token_times:
            return None
        return (self.token_times[-1] - self.first_token_time) / (n - 1)

    def answer_wait(self) -> float | None:
        """Seconds from arrival to the first token, or to the terminal answer without one."""
        answered = self.first_token_time if self.first_token_time is not None else self.end_time
        return None if answered is None else answered - self.arrival

    def max_tbt(self) -> float | None:
        """The longest gap between two tokens (chunks, for a streaming client)."""
        if len(self.token_times) < 2:
            return None
        return max(b - a for a, b in zip(self.token_times, self.token_times[1:]))


def failure_outcome(code: str | None) -> Outcome:
    """How a request that ended with error `code` reads in the records: `dropped` when the
    server shed it under load (ipc/api_codes.py SHED_CODES), else `errored` -- alike for a
    simulated run and a live one."""
    return "dropped" if code in SHED_CODES else "errored"


class RecordRow(msgspec.Struct, kw_only=True):
    """One line of a `--records` file: what happened to one request, and whether it met
    its targets (`met_slo`, as goodput counts it). Times in seconds; `arrival` from the
    start of the run."""
    index: int
    arrival: float
    prompt_tokens: int
    output_tokens: int                 # generated (asked for: `max_tokens`)
    max_tokens: int
    slo_class: str | None
    ttft_slo: float
    tbt_slo: float
    outcome: Outcome
    met_slo: bool
    instances: list[int]               # every instance that held it, in order
    offloaded: bool
    queue_delay: float | None          # arrival -> its prefill started (None: it never did)
    ttft: float | None
    mean_tbt: float | None
    max_tbt: float | None
    finish_reason: str | None
    error_code: str | None             # why it was dropped or failed
    measured: bool = True              # inside the steady-state window (not warm-up/cool-down)
    #: arrival -> its first answer: the first token, or the terminal answer of a request
    #: that got none (drop, error); None while it had neither (lost).
    answer_wait: float | None = None
    cached_tokens: int = 0             # prompt tokens found in its instance's prefix cache
    role: str | None = None            # its instance's role when it served it (`<n>A`)
    tenant: str | None = None          # who sent it (a workload with a tenant mix)


class Percentiles(msgspec.Struct):
    """Summary of a sample; every field None when the sample is empty."""
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None


class ClassResult(msgspec.Struct, kw_only=True):
    """Goodput of one SLO class of a run whose requests carry classes
    (bench/loadgen/workloads.py)."""
    slo_class: str
    num_requests: int
    good: int
    goodput_pct: float
    ttft_slo_s: float
    tbt_slo_s: float


class TenantResult(msgspec.Struct, kw_only=True):
    """What one tenant of a run whose requests carry tenants got (bench/records/results.py
    `per_tenant`)."""
    tenant: str
    priority: int                      # its requests' (the first's); < 0: sheddable
    num_requests: int
    good: int
    goodput_pct: float
    #: Prompt + output tokens of its completed requests: what the server computed for it.
    served_tokens: int
    dropped: int
    p99_ttft_s: float | None           # over its completed requests
    token_goodput_pct: float           # its good requests' prompt + output tokens, % of its


class PhaseResult(msgspec.Struct, kw_only=True):
    """Goodput of one phase of a `shifting` workload (bench/loadgen/shifting.py)."""
    phase: str
    num_requests: int
    good: int
    goodput_pct: float


class RunResult(msgspec.Struct, kw_only=True):
    """What one run (bench or simulate) reports. Times in seconds, rates per second."""
    config: dict
    num_requests: int
    duration_s: float
    ttft_slo_s: float
    tbt_slo_s: float
    #: `--goodput e2el:MS`: a good request also ended within this (absent without one).
    e2el_slo_s: float | msgspec.UnsetType = msgspec.UNSET
    goodput_pct: float                 # share of all requests that met both targets, %
    #: share of all requests' prompt + output tokens that belonged to good requests, %
    token_goodput_pct: float = 0.0
    goodput_rps: float                 # requests that met both targets / duration
    throughput_rps: float              # completed requests / duration
    output_tok_s: float                # output tokens delivered / duration
    #: The rates apart from the drain (`duration_s`'s include it): the arrival window
    #: (first to last request sent), the rate offered in it (gaps between arrivals / the
    #: window), the rate achieved in it (requests completed within it / the window), and
    #: the drain (the last answer after the last arrival).
    arrival_window_s: float = 0.0
    offered_rps: float = 0.0
    achieved_rps: float = 0.0
    drain_s: float = 0.0
    ttft_s: Percentiles                # over completed requests
    tbt_s: Percentiles                 # over every token gap of completed requests
    mean_tbt_s: Percentiles            # over completed requests' mean TBT
    sched_delay_s: Percentiles         # over requests that report it
    p99_tbt_s: float | None
    good: int
    completed: int
    dropped: int
    errored: int
    lost: int
    offloaded: int
    #: Warm-up requests sent first to prime the server (a multi-turn run's earlier turns),
    #: left out of every figure above.
    primed: int = 0
    perf_model_mape: float | None = None
    #: Share of the completed requests' prompt tokens found in a prefix cache, %.
    prompt_cached_pct: float = 0.0
    per_instance: list[dict] = []
    per_class: list[ClassResult] = []  # by SLO class, when the requests carry one
    per_phase: list[PhaseResult] = []  # by phase, for a `shifting` workload
    per_tenant: list[TenantResult] = []  # by tenant, when the requests carry one
    schema_version: int = SCHEMA_VERSION
    #: Every request, only when asked for (large); left out of the JSON otherwise.
    records: list[RequestRecord] | msgspec.UnsetType = msgspec.UNSET
