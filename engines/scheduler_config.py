"""A scheduler's settings (a msgspec struct: set in TOML, sent to instances as JSON)."""
from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from engines.modes import get_mode
from policies.offload import DEFAULT_OFFLOAD_THRESHOLD
from policies.value import DEFAULT_VALUE_FUNCTION, get_value_function


#: The value functions of policies/value.py by name (a test keeps the two lists equal).
ValueFunctionName = Literal["edf", "sjf", "ljf", "fcfs", "slack"]


class SchedulerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How each instance schedules its steps. One struct for `serve` ([scheduler] in TOML,
    flags), the simulator and the instance processes; the layout sets each one's `mode`."""

    mode: Annotated[str, Meta(description=(
        "sarathi | vllm-v0 | vllm-v1 | sglang | lp | hp | prefill | decode: set per instance "
        "by the layout, never by hand."))] = "sarathi"
    chunk_size: Annotated[int, Meta(ge=1, description=(
        "Token budget of one engine step (Sarathi-Serve's chunk size); in vllm-v0 mode the "
        "most prompt tokens one prefill step may batch (at least the context limit)."))] = 2048
    max_num_seqs: Annotated[Annotated[int, Meta(ge=1)] | None, Meta(examples=[128], description=(
        "Most requests holding KV blocks at once per instance; unset = the mode's default "
        "(LP 256, HP 1024, else 256, at most chunk_size in decode-first modes)."))] = None
    value_function: Annotated[ValueFunctionName, Meta(description=(
        'How LP instances order waiting prompts: "edf" (latest start time), "sjf", "ljf", '
        '"fcfs" or "slack" (shortest first while the deadline allows, then least slack, '
        "with aging). HP instances always run edf: they exist to meet deadlines."
        ))] = DEFAULT_VALUE_FUNCTION
    offload_threshold: Annotated[float, Meta(ge=0.0, description=(
        "An LP instance offloads a waiting request to an HP one when its slack falls under "
        "this times the worst-case HP latency."))] = DEFAULT_OFFLOAD_THRESHOLD
    offload_ipc_delay: Annotated[float, Meta(ge=0.0, description=(
        "Predicted seconds for an offload to reach an HP instance through the "
        "controller."))] = 0.002
    drop_expired: Annotated[bool, Meta(description=(
        "Drop a waiting request once its TTFT SLO is lost (the client gets a 503 saying "
        "so)."))] = False
    prefix_caching: Annotated[bool, Meta(description=(
        "Automatic prefix caching: full KV blocks are named by their tokens and prefix and "
        "kept after their request ends (evicted least recently used when memory is needed), "
        "so a prompt that starts like an earlier one skips computing that part."))] = True

    def resolved_max_num_seqs(self) -> int:
        if self.max_num_seqs is not None:
            return self.max_num_seqs
        mode = get_mode(self.mode)
        cap = mode.default_max_num_seqs
        return cap if mode.prefill_first else min(cap, self.chunk_size)

    def validate(self) -> "SchedulerConfig":
        mode = get_mode(self.mode)
        get_value_function(self.value_function)
        if not mode.prefill_first and self.resolved_max_num_seqs() > self.chunk_size:
            raise ValueError(
                f"max_num_seqs ({self.max_num_seqs}) must not exceed chunk_size ({self.chunk_size}) "
                f"in {self.mode} mode: every running decode must fit in one step's token budget")
        return self
