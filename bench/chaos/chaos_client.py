"""One `ascendra chaos` client: a streaming completion, and the answer it got.

    completed  a finish reason, after exactly the tokens it asked for
    dropped    a 503 with a reason code before its first token, by reason
    errored    any other error answer (an HTTP status or an SSE error event), by message
    cancelled  the client left on purpose
    refused    never reached the daemon (its port had closed after the drain)
    lost       no terminal answer (the default until one arrives)
"""
from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass

import aiohttp

from bench.loadgen.sse import sse_data
from ipc.api_codes import REFUSAL_CODES, EndCode

#: Error codes that mean "not served, and said why" rather than a failure: every refusal of
#: a new request, and the ends of an accepted one before its first token: shed for its TTFT
#: SLO, ended by the drain, or left with no instance to go to.
DROP_CODES = frozenset({*REFUSAL_CODES.values(), *(code.value for code in (
    EndCode.TTFT_SLO_MISSED, EndCode.SHUTTING_DOWN, EndCode.UNAVAILABLE))})


@dataclass
class Answer:
    index: int
    max_tokens: int
    cancel_after: int | None
    outcome: str = "lost"
    reason: str = ""                  # drop code, or error message
    tokens: int = 0                   # token events received
    usage_tokens: int | None = None
    sent_at: float = 0.0


async def one_request(session: aiohttp.ClientSession, url: str, answer: Answer,
                      prompt: list[int]) -> None:
    body = {"prompt": prompt, "max_tokens": answer.max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True, "temperature": 0.0}
    try:
        async with session.post(url + "/v1/completions", json=body) as response:
            if response.status != 200:
                raw = await response.read()
                try:
                    error = json.loads(raw)["error"]
                except (ValueError, KeyError, TypeError):
                    error = {"message": raw[:200].decode("utf-8", "replace")}
                record_error(answer, error, f"HTTP {response.status}")
                return
            await _read_stream(response, answer)
    except asyncio.CancelledError:
        raise
    except (aiohttp.ClientConnectorError, ConnectionRefusedError):
        answer.outcome = "refused"
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        if answer.outcome == "lost":
            answer.reason = f"{type(exc).__name__}: {exc}"


async def _read_stream(response: aiohttp.ClientResponse, answer: Answer) -> None:
    finished = False
    async for data in sse_data(response.content):
        if data.strip() == "[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            record_error(answer, event["error"], "SSE")
            return
        if event.get("usage"):
            answer.usage_tokens = event["usage"].get("completion_tokens")
        if event.get("choices"):
            answer.tokens += 1
            if event["choices"][0].get("finish_reason"):
                finished = True
            elif answer.cancel_after is not None and answer.tokens >= answer.cancel_after:
                answer.outcome = "cancelled"
                response.close()  # the client leaves mid-stream
                return
    if not finished:
        answer.reason = "the stream ended without a finish reason or an error"
        return
    if answer.tokens != answer.max_tokens or answer.usage_tokens != answer.max_tokens:
        answer.reason = (f"completed with {answer.tokens} token events and usage "
                         f"{answer.usage_tokens}; asked for {answer.max_tokens}")
        return  # stays lost: a resumed stream gained or lost tokens
    answer.outcome = "completed"


def record_error(answer: Answer, error: dict, where: str) -> None:
    """A drop: an HTTP error with a reason code (before any token). Anything else -- an
    SSE error event ends a stream that had started -- is an error, grouped by message."""
    code = error.get("code") if isinstance(error, dict) else None
    message = str(error.get("message") if isinstance(error, dict) else error)
    if code in DROP_CODES and where != "SSE":
        answer.outcome, answer.reason = "dropped", code
    else:
        answer.outcome = "errored"
        answer.reason = f"{where}: " + re.sub(r"\d+(\.\d+)?", "N", message)[:160]
