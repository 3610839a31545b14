"""A tiny stand-in for `engines.request.Request` with just what the policies read."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


@dataclass(eq=False)
class FakeRequest:
    name: str
    num_prompt_tokens: int
    deadline: float = float("inf")
    arrival_time: float = 0.0
    priority: int = 0
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    num_preemptions: int = 0
    max_tokens: int = 256
    block_table: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def prefill_started(self) -> bool:
        return self.num_computed_tokens > 0 or self.num_preemptions > 0

    @property
    def sampling(self) -> SimpleNamespace:
        return SimpleNamespace(max_tokens=self.max_tokens)


def names(requests) -> list[str]:
    return [r.name for r in requests]
