"""OpenAI-compatible request bodies, validated by msgspec (errors name the field)."""
from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from ipc.params import SamplingParams

#: Seeds travel as msgpack integers (int64) and seed a torch.Generator.
Seed = Annotated[int, Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
#: SLOs are finite seconds: at most a day.
SloSeconds = Annotated[float, Meta(gt=0.0, le=86400.0)]
StopString = Annotated[str, Meta(min_length=1)]


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


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
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    user: str | None = None
    # Ascendra extensions
    ignore_eos: bool = False
    ttft_slo: SloSeconds | None = None   # seconds
    tbt_slo: SloSeconds | None = None    # seconds
    priority: Annotated[int, Meta(ge=0, le=100)] = 0          # higher class is served first

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop: at most 4 non-empty strings")
        return stops

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def sampling(self, default_max_tokens: int, max_tokens_limit: int) -> SamplingParams:
        if self.n != 1:
            raise ValueError(f"n: only n=1 is supported (got {self.n})")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ValueError(f"{name}: not supported; leave it at 0")
        max_tokens = self.requested_max_tokens() or default_max_tokens
        if max_tokens > max_tokens_limit:
            raise ValueError(f"max_tokens: {max_tokens} is over this server's limit of {max_tokens_limit}")
        return SamplingParams(max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
                              top_k=max(self.top_k, 0), seed=self.seed, ignore_eos=self.ignore_eos)


class CompletionRequest(_Common, kw_only=True):
    prompt: str | list[int]
    echo: bool = False
    logprobs: None = None

    def sampling(self, default_max_tokens: int, max_tokens_limit: int) -> SamplingParams:
        if self.echo:
            raise ValueError("echo: not supported; leave it false")
        return super().sampling(default_max_tokens, max_tokens_limit)


class TextPart(msgspec.Struct):
    type: Literal["text"]
    text: str


class ChatMessage(msgspec.Struct):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Common, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def parse_body(body: bytes, kind: type[msgspec.Struct]):
    """Decode a JSON body into `kind`; ValueError with the field's path on any problem."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"body is not valid JSON: {exc}") from None
