"""Sampling parameters: what a client asks of one request's generation.

A msgspec struct so the same object is validated at the HTTP edge, travels on the
wire between controller and instances, and is read by the executor's sampler.
"""
from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta


class SamplingParams(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    max_tokens: Annotated[int, Meta(ge=1)] = 16
    temperature: Annotated[float, Meta(ge=0.0, le=100.0)] = 0.0
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Meta(ge=0)] = 0  # 0: no top-k cut
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = []

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def create(cls, **fields) -> "SamplingParams":
        """Build and validate; a bad value raises ValueError naming the field."""
        try:
            return msgspec.convert(fields, cls)
        except msgspec.ValidationError as exc:
            raise ValueError(f"invalid sampling parameters: {exc}") from None
