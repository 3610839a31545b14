"""Incremental detokenization with stop strings, one per streaming request.

Tokens arrive one at a time; text goes out as soon as it is final: a token that
ends inside a multi-byte UTF-8 character waits for the next one, and the tail
that could still become a stop string is held back until it cannot.
"""
from __future__ import annotations

from typing import Protocol


class Decoder(Protocol):
    def decode(self, ids: list[int]) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decoder, stop: list[str] | None = None) -> None:
        self.tokenizer = tokenizer
        self.stop = stop or []
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.prefix_offset = 0  # decode from here: earlier tokens' text is settled
        self.read_offset = 0    # tokens up to here are already in `pending` or emitted
        self.pending = ""       # decoded, not yet sent (could start a stop string)
        self.stopped = False

    def add(self, token_id: int) -> str:
        """Feed one token; returns the text that became final (maybe empty)."""
        if self.stopped:
            return ""
        self.ids.append(token_id)
        before = self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset])
        after = self.tokenizer.decode(self.ids[self.prefix_offset:])
        if after.endswith("\ufffd"):
            return ""  # an incomplete character: wait for the rest of its bytes
        self.pending += after[len(before):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return self._release()

    def flush(self) -> str:
        """At the end of generation: whatever is still held back."""
        if self.stopped:
            return ""
        text, self.pending = self.pending, ""
        return text

    def _release(self) -> str:
        hits = [at for at in (self.pending.find(s) for s in self.stop) if at >= 0]
        if hits:
            self.stopped = True
            text, self.pending = self.pending[:min(hits)], ""
            return text
        cut = len(self.pending) - self.holdback
        if cut <= 0:
            return ""
        text, self.pending = self.pending[:cut], self.pending[cut:]
        return text
