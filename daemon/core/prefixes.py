"""The controller core's prefix-cache bookkeeping: the component that owns the
`PrefixIndex` (what each instance is known to hold) and names a new request's prompt.

A request's prompt is named block by block when it arrives and looked up in the index
(`look_up`): routing (`policies.routing.prefix_aware`, the waiting room's
`Waiting.cost_on`) and the HP gate then count only the tokens an instance would still
have to compute. Every Submit records the prompt's blocks for its instance (`sent`), and
a completed request its output's too (`completed`; a conversation's next turn starts
with both); the ledger calls both. What an instance actually found arrives with the step
that admitted the request (`StepOutputs.cached`, `Ledger.found_cached`) and ends up in
its `Settle` (OpenAI's `usage.prompt_tokens_details.cached_tokens`). Sans-I/O.
"""
from __future__ import annotations

from daemon.core.prefix_index import PrefixIndex
from daemon.core.request_state import Tracked
from ipc.messages import Ready


class Prefixes:
    def __init__(self) -> None:
        self.index = PrefixIndex()

    def ready(self, ready: Ready) -> None:
        """An instance serves (again, after a restart: with nothing cached)."""
        self.index.ready(ready)

    def look_up(self, prompt: list[int]) -> tuple[list[bytes], dict[int, int]]:
        """A new prompt's block names, and the prompt tokens each instance would find."""
        if not self.index.active:
            return [], {}
        names = self.index.names(prompt)
        return names, self.index.cached_tokens(names, len(prompt))

    def sent(self, tracked: Tracked, target: int) -> None:
        self.index.record(target, tracked.block_names)

    def completed(self, tracked: Tracked, instance: int | None) -> None:
        """Its instance keeps its prompt and output blocks (until it needs the memory): all
        but the last token's, which no step computed."""
        if instance is not None and self.index.active:
            tokens = tracked.original.prompt_token_ids + tracked.token_ids[:-1]
            self.index.record(instance, self.index.extended(tracked.block_names, tokens))
