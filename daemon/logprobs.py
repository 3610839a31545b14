"""Log-probabilities as OpenAI shapes them, from the TokenLogprobs an instance sends.

Completions (legacy): `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`, one
entry per token; `top_logprobs[i]` maps the top alternatives' text (plus the sampled
token's, so up to logprobs + 1 entries) to their logprob, `text_offset[i]` is where
token i starts in the choice's text (after an echoed prompt). Chat: `{"content": [{"token",
"logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": None}`.
A stream sends each token's part in its chunk. A token that is only part of a UTF-8
character is written `bytes:\\xNN...` (its exact bytes are in `bytes`).
"""
from __future__ import annotations

import functools

from ipc.messages import MIN_LOGPROB, TokenLogprobs


class TokenText:
    """Each token's text and bytes, cached (at most one entry per vocabulary token)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.text = functools.lru_cache(maxsize=1 << 16)(self._text)

    def bytes(self, token_id: int) -> list[int]:
        return list(self._bytes(token_id))

    def _bytes(self, token_id: int) -> bytes:
        exact = getattr(self.tokenizer, "token_bytes", None)
        if exact is not None:
            return exact(token_id)
        return self.tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def _text(self, token_id: int) -> str:
        raw = self._bytes(token_id)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


@functools.lru_cache(maxsize=4)
def token_text_for(tokenizer) -> TokenText:
    """One TokenText (and so one cache) per tokenizer."""
    return TokenText(tokenizer)


def _floor(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)  # -inf is not JSON


class CompletionLogprobs:
    """The legacy shape for one choice; `take()` returns what was added since the last
    take (a stream chunk's part), `whole()` everything (a full response)."""

    def __init__(self, text: TokenText, offset: int = 0) -> None:
        self.text, self.offset = text, offset
        self.tokens: list[str] = []
        self.token_logprobs: list[float] = []
        self.top_logprobs: list[dict[str, float]] = []
        self.text_offset: list[int] = []
        self._taken = 0

    def add(self, token_id: int, logprobs: TokenLogprobs) -> None:
        token = self.text.text(token_id)
        top = {self.text.text(t): _floor(lp)
               for t, lp in zip(logprobs.top_token_ids, logprobs.top_logprobs)}
        top.setdefault(token, _floor(logprobs.logprob))
        self.tokens.append(token)
        self.token_logprobs.append(_floor(logprobs.logprob))
        self.top_logprobs.append(top)
        self.text_offset.append(self.offset)
        self.offset += len(token)

    def _slice(self, start: int) -> dict:
        return {"tokens": self.tokens[start:], "token_logprobs": self.token_logprobs[start:],
                "top_logprobs": self.top_logprobs[start:], "text_offset": self.text_offset[start:]}

    def take(self) -> dict:
        part, self._taken = self._slice(self._taken), len(self.tokens)
        return part

    def whole(self) -> dict:
        return self._slice(0)


class ChatLogprobs:
    """The chat shape for one choice; `take()` and `whole()` as for completions."""

    def __init__(self, text: TokenText) -> None:
        self.text = text
        self.content: list[dict] = []
        self._taken = 0

    def _entry(self, token_id: int, logprob: float) -> dict:
        return {"token": self.text.text(token_id), "logprob": _floor(logprob),
                "bytes": self.text.bytes(token_id)}

    def add(self, token_id: int, logprobs: TokenLogprobs) -> None:
        entry = self._entry(token_id, logprobs.logprob)
        entry["top_logprobs"] = [self._entry(t, lp) for t, lp in
                                 zip(logprobs.top_token_ids, logprobs.top_logprobs)]
        self.content.append(entry)

    def take(self) -> dict:
        part, self._taken = self.content[self._taken:], len(self.content)
        return {"content": part, "refusal": None}

    def whole(self) -> dict:
        return {"content": self.content, "refusal": None}
