"""Per-request state inside one engine instance.

One token list holds the prompt followed by the generated tokens. The scheduler
only ever asks "how many of these tokens are already in the KV cache?"
(`num_computed_tokens`): a prefill chunk, a decode step and a recompute after
preemption are all the same move -- compute the next tokens that are not cached.
"""
from __future__ import annotations

import enum

from ipc.params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"      # holds no KV blocks
    RUNNING = "running"      # holds KV blocks (prefilling or decoding)
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"            # EOS or a stop token
    LENGTH = "length"        # max_tokens or the model's context limit
    ABORT = "abort"          # cancelled by the client or the controller
    OFFLOAD = "offload"      # handed to an HP instance before its prefill started
    DROP = "ttft_slo_missed"  # given up on: its TTFT SLO is lost (drop_expired)


class Request:
    __slots__ = (
        "request_id", "token_ids", "num_prompt_tokens", "sampling", "arrival_time",
        "deadline", "priority", "num_computed_tokens", "block_table", "status",
        "finish_reason", "num_preemptions", "first_token_time", "rng", "max_total_tokens",
        "tbt_slo", "offloaded",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        arrival_time: float = 0.0,
        deadline: float = float("inf"),
        priority: int = 0,
        tbt_slo: float = float("inf"),
        offloaded: bool = False,
        preempted: bool = False,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError(f"request {request_id}: prompt has no tokens")
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.sampling = sampling
        self.arrival_time = arrival_time
        self.deadline = deadline
        self.priority = priority
        self.tbt_slo = tbt_slo
        self.offloaded = offloaded  # arrived here as an offload from an LP instance
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        # `preempted`: it arrives already preempted by recompute (its instance died
        # mid-decode; its output so far is part of the prompt): like a request preempted
        # here, it counts as started -- never offloaded, dropped or demoted.
        self.num_preemptions = 1 if preempted else 0
        self.first_token_time: float | None = None
        self.rng = None  # the executor's per-request sampling state (seeded requests)
        self.max_total_tokens = self.num_prompt_tokens + sampling.max_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """Everything but the newest token is cached: the next step is one decode."""
        return len(self.token_ids) - self.num_computed_tokens == 1 and self.num_output_tokens > 0

    @property
    def prefill_started(self) -> bool:
        return self.num_computed_tokens > 0 or self.num_preemptions > 0

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens})")
