"""OpenAI-shaped response bodies: completion and chat objects, errors.

A response holds one choice per engine request (prompts x n, `index` in that order).
A streamed response's chunks are daemon/stream_events.py's (same envelope, as bytes).
"""
from __future__ import annotations

import time


def error_body(message: str, status: int, param: str | None = None, code: str | None = None) -> dict:
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 401:
        kind = "authentication_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict:
    """OpenAI's usage object; `cached_tokens`: prompt tokens found in the prefix cache."""
    counts = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
              "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        counts["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return counts


def model_object(name: str, max_model_len: int) -> dict:
    """One entry of GET /v1/models (and GET /v1/models/{id})."""
    return {"id": name, "object": "model", "created": 0, "owned_by": "ascendra",
            "max_model_len": max_model_len}


class ResponseBuilder:
    """Builds the bodies of one request, completion (`text_completion`) or chat."""

    def __init__(self, request_id: str, model: str, chat: bool) -> None:
        self.id = request_id
        self.model = model
        self.chat = chat
        self.created = int(time.time())

    def choice(self, index: int, text: str | None, finish_reason: str | None,
               logprobs: dict | None = None, tool_calls: list[dict] | None = None) -> dict:
        """`tool_calls`: daemon/tool_calls.py's (their stream `index` is left out here)."""
        if not self.chat:
            return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        message = {"role": "assistant", "content": text}
        if tool_calls:
            message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"}
                                     for c in tool_calls]
        return {"index": index, "message": message, "logprobs": logprobs,
                "finish_reason": finish_reason}

    def full(self, choices: list[dict], prompt_tokens: int, completion_tokens: int,
             cached_tokens: int | None = None) -> dict:
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices,
                "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}
