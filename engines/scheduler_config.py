"""A scheduler's settings (a msgspec struct: set in TOML, sent to instances as JSON)."""
from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from engines.modes import get_mode
from policies.offload import DEFAULT_OFFLOAD_THRESHOLD
from policies.value import DEFAULT_VALUE_FUNCTION, get_value_function


class SchedulerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    mode: str = "sarathi"
    #: Token budget of one iteration (Sarathi-Serve's chunk size).
    chunk_size: Annotated[int, Meta(ge=1)] = 512
    #: Most requests holding KV blocks at once; default from the mode (LP: 128), at most
    #: chunk_size in decode-first modes.
    max_num_seqs: Annotated[int, Meta(ge=1)] | None = None
    #: How LP and HP order waiting prompts: edf | sjf | ljf | fcfs.
    value_function: str = DEFAULT_VALUE_FUNCTION
    #: LP offloads a request when its slack falls under this many worst-case HP latencies.
    offload_threshold: Annotated[float, Meta(ge=0.0)] = DEFAULT_OFFLOAD_THRESHOLD
    #: Predicted seconds for an offload to reach an HP instance through the controller.
    offload_ipc_delay: Annotated[float, Meta(ge=0.0)] = 0.002
    #: Give up on a waiting request once its TTFT SLO is lost (overload runs).
    drop_expired: bool = False

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
