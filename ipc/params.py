"""Sampling parameters: what a client asks of one request's generation.

A msgspec struct so the same object is validated at the HTTP edge, travels on the
wire between controller and instances, and is read by the executor's sampler.
Penalties and `logit_bias` change the logits a token is chosen from (as OpenAI and vLLM
define them); `logprobs` asks for the sampled token's log-probability under the model's
raw distribution and that many top alternatives (engines/executors/sampler.py).
`grammar` constrains the output (engines/grammar.py); it travels with the request, so an
instance it is offloaded, handed off or resumed to compiles it again from this text.
"""
from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

#: The most top alternatives one token's log-probabilities may list (OpenAI's chat limit).
MAX_LOGPROBS = 20


class GrammarSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the output must match, as the client gave it (compiled by engines/grammar.py).

    json_schema: `source` is the schema as JSON text (json_object: `{"type": "object"}`);
    regex: a regular expression; choice: a JSON list of the strings allowed; lark: a
    llguidance Lark grammar (tool calls: daemon/tool_calls.py builds it)."""
    kind: Literal["json_schema", "regex", "choice", "lark"]
    source: str


class SamplingParams(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    max_tokens: Annotated[int, Meta(ge=1)] = 16
    temperature: Annotated[float, Meta(ge=0.0, le=100.0)] = 0.0
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Meta(ge=0)] = 0  # 0: no top-k cut
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = []
    #: Subtracted from a token's logit once if it was generated before (presence) and
    #: once per time it was (frequency); the prompt does not count.
    presence_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] = 0.0
    frequency_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] = 0.0
    #: Token id -> added to its logit before sampling (and before greedy's argmax).
    logit_bias: dict[Annotated[int, Meta(ge=0)], Annotated[float, Meta(ge=-100.0, le=100.0)]] = {}
    #: None: no log-probabilities; k: the sampled token's and the k most likely tokens'.
    logprobs: Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)] | None = None
    #: None: any output; else each token is picked from those the grammar still allows.
    grammar: GrammarSpec | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def changes_logits(self) -> bool:
        """Penalties or a logit bias: the sampler must adjust the model's logits."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)

    @classmethod
    def create(cls, **fields) -> "SamplingParams":
        """Build and validate; a bad value raises ValueError naming the field."""
        try:
            return msgspec.convert(fields, cls)
        except msgspec.ValidationError as exc:
            raise ValueError(f"invalid sampling parameters: {exc}") from None
