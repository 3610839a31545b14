"""The executor interface: run one batch, return the sampled tokens; and what an instance
reads off its executor (capacity, context limit, vocabulary, device, KV hand-offs)."""
from __future__ import annotations

from typing import Any, Protocol

from engines.batch import Batch


class Executor(Protocol):
    #: KV cache capacity in blocks of `block_size` tokens, fixed when the executor is built.
    num_kv_blocks: int
    block_size: int
    #: The longest context one request may reach.
    max_model_len: int
    #: Token ids that end a request (empty: only max_tokens or max_model_len end it).
    eos_token_ids: frozenset[int]
    #: Prompt ids at or past this are refused; None: any id (the sim executor).
    vocab_size: int | None
    #: The torch.device the model runs on, to wait for when timing a step; None: none.
    device: Any
    #: Whether export_kv/import_kv move real KV data (False: a P/D hand-off moves only
    #: the request, as in the simulator).
    carries_kv: bool

    def execute(self, batch: Batch) -> list[int]:
        """Run every chunk of `batch` in one forward pass.

        Writes each chunk's keys/values into the request's KV blocks (`request.block_table`,
        already allocated by the scheduler) and returns one sampled token id per chunk whose
        `samples` is true, in the order of `batch.chunks`. A request whose
        `sampling.logprobs` is set gets that token's `ipc.messages.TokenLogprobs` in
        `request.sampled_logprobs` (the scheduler moves them into its StepTokens).
        """
        ...

    def export_kv(self, block_table: list[int], num_tokens: int) -> tuple[Any, list]:
        """(engines.models.kv_transfer.KvLayout, one frame per layer) of the first
        `num_tokens` tokens' KV; (None, []) where `carries_kv` is False."""
        ...

    def import_kv(self, block_table: list[int], layout: Any, frames: list) -> None:
        """Write KV that `export_kv` made (maybe in another process) into `block_table`."""
        ...
