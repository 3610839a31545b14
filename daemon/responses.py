"""OpenAI-shaped response bodies: completion and chat objects, stream chunks, errors."""
from __future__ import annotations

import time


def error_body(message: str, status: int, param: str | None = None, code: str | None = None) -> dict:
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 401:
        kind = "authentication_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class ResponseBuilder:
    """Builds the bodies of one request, completion (`text_completion`) or chat."""

    def __init__(self, request_id: str, model: str, chat: bool) -> None:
        self.id = request_id
        self.model = model
        self.chat = chat
        self.created = int(time.time())

    def _envelope(self, chunk: bool) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _choice(self, text: str, finish_reason: str | None, delta: bool, first: bool) -> dict:
        if not self.chat:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        if delta:
            content = {"role": "assistant", "content": text} if first else {"content": text}
            return {"index": 0, "delta": content if (text or first) else {},
                    "logprobs": None, "finish_reason": finish_reason}
        return {"index": 0, "message": {"role": "assistant", "content": text},
                "logprobs": None, "finish_reason": finish_reason}

    def chunk(self, text: str, finish_reason: str | None = None, first: bool = False) -> dict:
        return {**self._envelope(True), "choices": [self._choice(text, finish_reason, True, first)]}

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        return {**self._envelope(True), "choices": [], "usage": usage(prompt_tokens, completion_tokens)}

    def full(self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> dict:
        return {**self._envelope(False), "choices": [self._choice(text, finish_reason, False, True)],
                "usage": usage(prompt_tokens, completion_tokens)}
