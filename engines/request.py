"""Per-request state inside one engine instance.

One token list holds the prompt followed by the generated tokens. The scheduler
only ever asks "how many of these tokens are already in the KV cache?"
(`num_computed_tokens`): a prefill chunk, a decode step and a recompute after
preemption are all the same move -- compute the next tokens that are not cached.
A prefix-cache hit is one more: admission starts the request at the cached length (a
waiting request's `num_computed_tokens` is that hint; it holds no blocks until then).
"""
from __future__ import annotations

import enum

from ipc.messages import FinishReason
from ipc.params import SamplingParams

__all__ = ["FinishReason", "Request", "RequestStatus"]


class RequestStatus(enum.Enum):
    WAITING = "waiting"      # holds no KV blocks
    RUNNING = "running"      # holds KV blocks (prefilling or decoding)
    FINISHED = "finished"


class Request:
    __slots__ = (
        "request_id", "token_ids", "num_prompt_tokens", "sampling", "arrival_time",
        "deadline", "priority", "num_computed_tokens", "block_table", "status",
        "finish_reason", "num_preemptions", "first_token_time", "rng", "max_total_tokens",
        "tbt_slo", "pinned", "generated_before", "sampled_logprobs",
        "block_hashes", "prefix_hit", "num_named_blocks", "num_cached_tokens",
        "grammar_state",
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
        pinned: bool = False,
        generated_before: int = 0,
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
        #: It stays here and counts as started (`ipc.messages.Origin.pinned`): never
        #: offloaded, dropped or demoted.
        self.pinned = pinned
        #: A resumed request: the last this-many prompt tokens are output it generated on
        #: an instance that died (`generated_token_ids` counts them for penalties).
        self.generated_before = generated_before
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.num_preemptions = 0
        self.first_token_time: float | None = None
        self.rng = None  # the executor's per-request sampling state (seeded requests)
        #: The executor's grammar matcher of a constrained request (engines/grammar.py):
        #: rebuilt from its generated tokens wherever it runs, so never sent anywhere.
        self.grammar_state = None
        #: The executor's log-probabilities of the token it just sampled (when
        #: `sampling.logprobs` is set); the scheduler moves them into that token's output.
        self.sampled_logprobs = None
        self.max_total_tokens = self.num_prompt_tokens + sampling.max_tokens
        # Prefix caching (engines/kv_cache.py): the names of its full blocks as far as
        # computed so far, the cached blocks a waiting request's prompt starts with (its
        # hint), how many of its blocks are named, and the prompt tokens its first
        # admission found cached (None until admitted).
        self.block_hashes: list[bytes] = []
        self.prefix_hit: list[int] = []
        self.num_named_blocks = 0
        self.num_cached_tokens: int | None = None

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
    def generated_token_ids(self) -> list[int]:
        """Every token generated for the request, before a resume too (what penalties count)."""
        return self.token_ids[self.num_prompt_tokens - self.generated_before:]

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """Everything but the newest token is cached: the next step is one decode."""
        n = len(self.token_ids)
        return n - self.num_computed_tokens == 1 and n > self.num_prompt_tokens

    @property
    def prefill_started(self) -> bool:
        """It holds KV blocks, was preempted, or is pinned (a waiting request's prefix hit
        does not count: it holds nothing yet)."""
        return bool(self.block_table) or self.num_preemptions > 0 or self.pinned

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens})")
