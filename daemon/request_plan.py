"""From a validated request body to its choices: the prompt and SamplingParams of each
engine request it becomes.

One choice per prompt x n, indexed in that order (as OpenAI and vLLM index them); a
seeded request's sample i gets seed + i. Every limit is checked here, before anything is
submitted: a prompt must leave room in the context (`max_model_len`); an explicit
`max_tokens` must fit beside it (400 in vLLM's words), an unset one is the server's
default clipped to what fits; at most MAX_CHOICES choices.
"""
from __future__ import annotations

from dataclasses import dataclass

from daemon.openai_fields import check_supported
from daemon.openai_schema import MAX_CHOICES, ChatCompletionRequest, CompletionRequest
from ipc.params import GrammarSpec, SamplingParams


class FieldError(ValueError):
    """A 400 about one field: `param` names it."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Prompt:
    field: str              # "prompt", "prompt[2]" or "messages": what errors name
    token_ids: list[int]
    text: str = ""          # what echo puts before the output


@dataclass(frozen=True)
class Choice:
    index: int
    prompt: Prompt
    sampling: SamplingParams


@dataclass(frozen=True)
class Limits:
    max_model_len: int
    vocab_size: int
    default_max_tokens: int
    max_tokens_limit: int


def plan_choices(body: CompletionRequest | ChatCompletionRequest, prompts: list[Prompt],
                 limits: Limits, grammar: GrammarSpec | None = None) -> list[Choice]:
    """The choices of `body` over `prompts`, each constrained by `grammar` when given
    (daemon/structured.py); FieldError (or ValueError "field: ...") for anything this
    server will not serve."""
    check_supported(body)
    if len(prompts) * body.n > MAX_CHOICES:
        raise FieldError("n", f"n: {len(prompts)} prompts x n={body.n} is {len(prompts) * body.n}"
                              f" choices; at most {MAX_CHOICES} choices per request")
    base = {"temperature": body.temperature, "top_p": body.top_p, "top_k": max(body.top_k, 0),
            "ignore_eos": body.ignore_eos, "presence_penalty": body.presence_penalty,
            "frequency_penalty": body.frequency_penalty,
            "logit_bias": body.logit_bias_ids(limits.vocab_size), "logprobs": body.num_logprobs(),
            "grammar": grammar}
    choices = []
    for prompt in prompts:
        max_tokens = _max_tokens(body, prompt, limits)
        for i in range(body.n):
            sampling = SamplingParams(max_tokens=max_tokens, seed=_seed(body.seed, i), **base)
            choices.append(Choice(len(choices), prompt, sampling))
    return choices


def _max_tokens(body, prompt: Prompt, limits: Limits) -> int:
    num_prompt, context = len(prompt.token_ids), limits.max_model_len
    if not num_prompt:
        raise FieldError(prompt.field, f"{prompt.field}: the prompt is empty")
    if num_prompt >= context:
        raise FieldError(prompt.field, f"{prompt.field}: the prompt is {num_prompt} tokens; "
                                       f"the limit is {context - 1} (context length {context})")
    requested = body.requested_max_tokens()
    if requested is None:
        return min(limits.default_max_tokens, context - num_prompt)
    field = body.max_tokens_field
    if requested > limits.max_tokens_limit:
        raise FieldError(field, f"{field}: {requested} is over this server's limit of "
                                f"{limits.max_tokens_limit}")
    if num_prompt + requested > context:
        where = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
        raise FieldError(field, f"This model's maximum context length is {context} tokens. "
                                f"However, you requested {num_prompt + requested} tokens "
                                f"({num_prompt} in the {where}, {requested} in the completion)."
                                f" Please reduce the length of the {where} or {field}.")
    return requested


def _seed(seed: int | None, i: int) -> int | None:
    """seed + i, wrapped into int64 (the wire's integers)."""
    if seed is None or i == 0:
        return seed
    return (seed + i + (1 << 63)) % (1 << 64) - (1 << 63)
