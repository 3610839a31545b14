"""The server-sent events of one streamed response, as bytes: one `data:` event per token.

A stream chunk is the response's envelope (`id`, `object`, `created`, `model` -- the
same in every chunk of a stream, so encoded once) around one choice's new text (and
its log-probabilities when asked): `{"id": ..., "choices": [{"index": 0, "text": ...,
"logprobs": null, "finish_reason": null}]}` for completions, a `delta` instead of `text`
for chat (`{"role": "assistant", "content": ...}` in a choice's first chunk, then
`{"content": ...}`, `{"content": ""}` when a token adds no text yet, as vLLM sends: never
an empty delta `{}`). Events are appended to a
bytearray, so every event ready at once goes out in one write; each is still its own
`data:` line, as OpenAI's clients and load testers expect. Encoded by msgspec; most
chunks differ only in their text, so for them only the text is (the bytes around it are
built once per choice).
"""
from __future__ import annotations

import msgspec

from daemon.responses import ResponseBuilder, error_body, usage
from ipc.serving_info import ServingInfo

DONE = b"data: [DONE]\n\n"
_END = b"\n\n"


class _Envelope(msgspec.Struct):
    id: str
    object: str
    created: int
    model: str


class _TextChoice(msgspec.Struct):
    index: int
    text: str
    logprobs: dict | None
    finish_reason: str | None


class _Delta(msgspec.Struct, omit_defaults=True):
    role: str | msgspec.UnsetType = msgspec.UNSET
    content: str | msgspec.UnsetType = msgspec.UNSET
    tool_calls: list[dict] | msgspec.UnsetType = msgspec.UNSET


class _ChatChoice(msgspec.Struct):
    index: int
    delta: _Delta
    logprobs: dict | None
    finish_reason: str | None


class StreamEvents:
    """Appends the events of one response (`builder`'s id, model, kind) to a bytearray."""

    def __init__(self, builder: ResponseBuilder, prompt_tokens: int | None = None) -> None:
        """`prompt_tokens`: given, every token's chunk carries the usage so far (vLLM's
        `stream_options.continuous_usage_stats`)."""
        self.chat = builder.chat
        self.prompt_tokens = prompt_tokens
        kind = "chat.completion.chunk" if builder.chat else "text_completion"
        self._encoder = msgspec.json.Encoder()
        envelope = self._encoder.encode(_Envelope(builder.id, kind, builder.created, builder.model))
        self._open = b"data: " + envelope[:-1] + b',"choices":['  # up to the choice
        self._close = b"]}" + _END
        #: A plain chunk (not the first, nor the last, no logprobs): the bytes before its
        #: text, per choice index, and after it -- only the text is encoded per token.
        self._plain_open: dict[int, bytes] = {}
        self._plain_close = (b"}" if self.chat else b"") + \
            b',"logprobs":null,"finish_reason":null}' + self._close

    def token(self, out: bytearray, index: int, text: str, finish_reason: str | None = None,
              first: bool = False, logprobs: dict | None = None, completion_tokens: int = 0,
              ) -> None:
        """One choice's chunk for one token: its new `text` (maybe empty: an event per
        token all the same, as clients time tokens by events); `completion_tokens`: the
        choice's tokens so far, for continuous usage."""
        continuous = self.prompt_tokens is not None
        if finish_reason is None and logprobs is None and not first and not continuous:
            out += self._plain_open.get(index) or self._plain_opening(index)
            self._encoder.encode_into(text, out, -1)
            out += self._plain_close
            return
        if self.chat:
            delta = _Delta("assistant", text) if first else _Delta(content=text)
            choice = _ChatChoice(index, delta, logprobs, finish_reason)
        else:
            choice = _TextChoice(index, text, logprobs, finish_reason)
        out += self._open
        self._encoder.encode_into(choice, out, -1)
        if continuous:
            out += b'],"usage":'
            self._encoder.encode_into(usage(self.prompt_tokens, completion_tokens), out, -1)
            out += b"}" + _END
            return
        out += self._close

    def tool_calls(self, out: bytearray, index: int, calls: list[dict]) -> None:
        """A chat choice's chunk of complete tool calls (daemon/tool_calls.py): each with
        its `index`, id, name and all its arguments at once, as OpenAI's deltas allow."""
        choice = _ChatChoice(index, _Delta(tool_calls=calls), None, None)
        out += self._open
        self._encoder.encode_into(choice, out, -1)
        out += self._close

    def _plain_opening(self, index: int) -> bytes:
        field = b'"delta":{"content":' if self.chat else b'"text":'
        opening = self._plain_open[index] = self._open + b'{"index":%d,' % index + field
        return opening

    def usage(self, out: bytearray, prompt_tokens: int, completion_tokens: int,
              cached_tokens: int | None = None) -> None:
        """The last chunk when `stream_options.include_usage`: no choices, the counts."""
        self.last(out, usage(prompt_tokens, completion_tokens, cached_tokens))

    def last(self, out: bytearray, counts: dict | None = None,
             serving_info: ServingInfo | None = None) -> None:
        """The last chunk, with no choices: the `usage` counts when
        `stream_options.include_usage`, `serving_info` when asked for (one of them at least)."""
        fields = {"usage": counts, "serving_info": serving_info}
        out += self._open
        out += b"]," + self._encoder.encode({k: v for k, v in fields.items()
                                              if v is not None})[1:]
        out += _END

    def error(self, out: bytearray, message: str, status: int, code: str | None = None,
              serving_info: ServingInfo | None = None) -> None:
        """A failure mid-stream, in OpenAI's error shape (the stream then ends); with
        `serving_info` beside the error when asked for."""
        body = error_body(message, status, code=code)
        if serving_info is not None:
            body["serving_info"] = serving_info
        out += b"data: " + self._encoder.encode(body) + _END
