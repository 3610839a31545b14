"""The controller core's prefix-cache bookkeeping (a mixin of `ControllerCore`, which owns
the state; sans-I/O like it): what each instance is known to hold (`PrefixIndex`), and
what each request found cached where it was served.

A request's prompt is named block by block when it arrives and looked up in the index:
routing (`policies.routing.prefix_aware`, the global queue's `Waiting.cost_on`) and the
HP gate then count only the tokens an instance would still have to compute. Every
Submit records the prompt's blocks for its instance, and a completed request its
output's too (a conversation's next turn starts with both). What an instance actually
found arrives with the step that admitted the request (`StepOutputs.cached`) and ends
up in its `Settle` (OpenAI's `usage.prompt_tokens_details.cached_tokens`).
"""
from __future__ import annotations

from collections.abc import Iterable

from daemon.core.request_state import Tracked
from ipc.messages import CachedPrompt


class Prefixes:
    def _look_up_prefix(self, prompt: list[int]) -> tuple[list[bytes], dict[int, int]]:
        """A new prompt's block names, and the prompt tokens each instance would find."""
        if not self.prefixes.active:
            return [], {}
        names = self.prefixes.names(prompt)
        return names, self.prefixes.cached_tokens(names, len(prompt))

    def _prefix_sent(self, tracked: Tracked, target: int) -> None:
        self.prefixes.record(target, tracked.block_names)

    def _prefix_completed(self, tracked: Tracked, instance: int | None) -> None:
        """Its instance keeps its prompt and output blocks (until it needs the memory): all
        but the last token's, which no step computed."""
        if instance is not None and self.prefixes.active:
            tokens = tracked.original.prompt_token_ids + tracked.token_ids[:-1]
            self.prefixes.record(instance, self.prefixes.extended(tracked.block_names, tokens))

    def _found_cached(self, view, cached: Iterable[CachedPrompt]) -> None:
        """An instance admitted these requests with part of their prompts cached."""
        for hit in cached:
            tracked = self._held(hit.request_id, view)
            if tracked is not None and tracked.first_token_time is None:
                tracked.num_cached_tokens = hit.num_cached_tokens
