"""OpenAI-compatible request bodies, validated by msgspec (errors name the field).

Every OpenAI field is declared, so the OpenAPI description lists it and a wrong type is a
400 naming it. Which of them this server implements, and which it refuses unless left at
a value that does not change the answer, is daemon/openai_fields.py; docs/api.md has
the table. Fields no struct declares are ignored (and logged once).
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
from msgspec import Meta

from ipc.params import MAX_LOGPROBS
from ipc.tenancy import MAX_PRIORITY, MIN_PRIORITY

#: Seeds travel as msgpack integers (int64) and seed a torch.Generator.
Seed = Annotated[int, Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
#: SLOs are finite seconds: at most a day.
SloSeconds = Annotated[float, Meta(gt=0.0, le=86400.0)]
StopString = Annotated[str, Meta(min_length=1)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
#: The most choices (prompts x n) one request may ask for; each is an engine request.
MAX_CHOICES = 128
#: OpenAI's limits: logit_bias entries, top alternatives per token (completions; chat's
#: is the most the wire carries, MAX_LOGPROBS).
MAX_LOGIT_BIAS = 300
MAX_COMPLETION_LOGPROBS = 5


class StreamOptions(msgspec.Struct):
    include_usage: bool = False
    #: vLLM's extension (guidellm sends it): every chunk carries the usage so far.
    continuous_usage_stats: bool = False


class JsonSchemaFormat(msgspec.Struct, kw_only=True):
    """`response_format.json_schema`: the output is JSON matching `schema`."""
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | bool | None = msgspec.field(default=None, name="schema")
    strict: bool | None = None  # the output always matches: strict or not


class ResponseFormat(msgspec.Struct):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(msgspec.Struct, kw_only=True):
    """vLLM's `structured_outputs`: exactly one of these constrains the output."""
    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None


class _Common(msgspec.Struct, kw_only=True):
    model: str | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Meta(ge=-1, le=(1 << 31) - 1)] = -1  # extension; -1 or 0 = off
    seed: Seed | None = None
    stop: StopString | Annotated[list[StopString], Meta(max_length=4)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_CHOICES)] = 1
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    #: token id (as a string, as JSON keys are) -> bias added to its logit
    logit_bias: Annotated[dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]],
                          Meta(max_length=MAX_LOGIT_BIAS)] | None = None
    response_format: ResponseFormat | None = None
    # vLLM's structured outputs (daemon/structured.py)
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    structured_outputs: StructuredOutputs | None = None
    user: str | None = None
    # Ascendra extensions
    ignore_eos: bool = False
    ttft_slo: SloSeconds | None = None   # seconds
    tbt_slo: SloSeconds | None = None    # seconds
    #: Higher bands are served first; < 0: sheddable (shed first when the box is
    #: saturated). None: the x-ascendra-priority header's, else the objective's, else 0.
    priority: Annotated[int, Meta(ge=MIN_PRIORITY, le=MAX_PRIORITY)] | None = None
    #: Add `serving_info` (ipc/serving_info.py) to the answer: where each choice ran.
    return_serving_info: bool = False

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop: at most 4 non-empty strings")
        return stops

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def max_tokens_field(self) -> str:
        return "max_tokens"

    def num_logprobs(self) -> int | None:
        """Top alternatives per token to report; None: no log-probabilities."""
        return None

    def logit_bias_ids(self, vocab_size: int) -> dict[int, float]:
        """`logit_bias` by token id; ValueError naming it for a key that is no token id."""
        bias: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit() and int(key) < vocab_size):
                raise ValueError(f"logit_bias: {key!r} is not a token id of this model "
                                 f"(0..{vocab_size - 1})")
            bias[int(key)] = value
        return bias


#: A text prompt, a token-id prompt, or a batch of either (one choice per prompt x n).
Prompt = str | list[str | int | list[int]]


class CompletionRequest(_Common, kw_only=True):
    prompt: Prompt
    echo: bool = False
    logprobs: Annotated[int, Meta(ge=0, le=MAX_COMPLETION_LOGPROBS)] | None = None
    suffix: str | None = None
    best_of: Annotated[int, Meta(ge=1, le=MAX_CHOICES)] | None = None

    def num_logprobs(self) -> int | None:
        return self.logprobs

    def prompts(self) -> list[tuple[str, str | list[int]]]:
        """(field, prompt) per prompt: "prompt" alone, "prompt[i]" in a batch.
        ValueError naming the entry that breaks the batch's kind."""
        prompt = self.prompt
        if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
            bad = next((i for i, t in enumerate(prompt) if not isinstance(t, int)), None) \
                if isinstance(prompt, list) else None
            if bad is not None:
                raise ValueError(f"prompt[{bad}]: a token-id prompt holds only token ids")
            return [("prompt", prompt)]
        kind = type(prompt[0])
        bad = next((i for i, p in enumerate(prompt) if type(p) is not kind), None)
        if bad is not None:
            what = "strings" if kind is str else "token-id lists"
            raise ValueError(f"prompt[{bad}]: a batch of prompts holds only {what}")
        return [(f"prompt[{i}]", p) for i, p in enumerate(prompt)]


class TextPart(msgspec.Struct):
    type: Literal["text"]
    text: str


class ChatMessage(msgspec.Struct):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None      # None: an assistant's tool calls only
    name: str | None = None                          # passed to the chat template
    tool_calls: list[dict[str, Any]] | None = None   # an assistant's earlier calls
    tool_call_id: str | None = None                  # a tool result's call

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def for_template(self) -> dict[str, str]:
        message = {"role": self.role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        return message


class ChatCompletionRequest(_Common, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)] | None = None
    # Tools (daemon/tool_calls.py); functions, audio and reasoning: refused unless unused
    # (daemon/openai_fields.py)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: Literal["none", "auto"] | dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    modalities: list[str] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: dict[str, Any] | None = None
    # Accepted: they do not change the answer
    prediction: dict[str, Any] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def max_tokens_field(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


#: Deepest nesting of JSON objects and arrays a body may have. msgspec's own limit
#: follows the C stack (Python 3.11 refuses 1,000 levels, 3.12 accepts them), so the API
#: checks its own: the same answer on every Python.
MAX_NESTING = 128
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def nesting_depth(body: bytes) -> int:
    """How deep JSON objects and arrays nest in `body` (brackets inside strings don't count).
    Cheap for ordinary bodies: under MAX_NESTING brackets in all, their count is the answer's
    upper bound and no scan is made."""
    openers = body.count(b"[") + body.count(b"{")
    if openers <= MAX_NESTING:
        return openers
    brackets = np.frombuffer(_STRINGS.sub(b"", body).translate(None, _NOT_BRACKETS), np.uint8)
    steps = np.where((brackets == ord("[")) | (brackets == ord("{")), 1, -1)
    return int(steps.cumsum().max(initial=0))



def parse_body(body: bytes, kind: type[msgspec.Struct]):
    """Decode a JSON body into `kind`; ValueError with the field's path on any problem."""
    if nesting_depth(body) > MAX_NESTING:
        raise ValueError(f"body is nested too deeply (JSON objects and arrays nest at most "
                         f"{MAX_NESTING} levels here)")
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"body is not valid JSON: {exc}") from None
    except RecursionError:  # a stack smaller than MAX_NESTING levels needs
        raise ValueError("body is nested too deeply for this server's stack") from None


class TokenizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /tokenize (as vLLM's): a completion prompt or chat messages, exactly one."""
    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Meta(min_length=1)] | None = None


class TokenizeResponse(msgspec.Struct):
    count: int               # the prompt's tokens as a request would send them to the model
    max_model_len: int       # the longest prompt + output the server takes (0: none ready)
    tokens: list[int]
