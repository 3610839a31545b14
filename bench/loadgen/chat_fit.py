"""Chat requests that fit the server's context, counted by the server.

A chat request's prompt is words (bench/loadgen/loadgen.py `chat_prompt`), and the server
adds its chat template; the trace's token counts say nothing of how many tokens that
makes on the server's tokenizer. So before a run, each chat prompt is counted by the
server itself (`POST /tokenize`, as vLLM serves it) and, when prompt + output would not
fit `max_model_len`, trimmed to fit (fewer words) or, if it cannot, skipped -- as
`vllm bench serve` filters dataset rows that do not fit. A server without /tokenize
keeps the estimate.
"""
from __future__ import annotations

import asyncio

import aiohttp
import msgspec

from bench.loadgen.loadgen import auth_headers, chat_prompt
from bench.loadgen.workload import WorkloadRequest

#: Concurrent /tokenize calls, and tries to trim one prompt before it is skipped.
CONCURRENCY = 16
TRIES = 4


class ChatFit(msgspec.Struct):
    requests: list[WorkloadRequest]
    trimmed: int
    skipped: int
    counted: bool            # the server counted them (False: no /tokenize, estimate kept)


async def fit_chat_prompts(url: str, api_key: str, model: str | None,
                           requests: list[WorkloadRequest], max_model_len: int,
                           seed: int) -> ChatFit:
    async with aiohttp.ClientSession(headers=auth_headers(api_key),
                                     timeout=aiohttp.ClientTimeout(total=30)) as session:
        count = _Counter(session, url.rstrip("/") + "/tokenize", model)
        if await count(chat_prompt(seed, 0, 1)) is None:
            return ChatFit(list(requests), 0, 0, counted=False)
        slots = asyncio.Semaphore(CONCURRENCY)

        async def fit(request: WorkloadRequest) -> WorkloadRequest | None:
            async with slots:
                return await _fit_one(count, request, max_model_len, seed)

        fitted = await asyncio.gather(*(fit(r) for r in requests))
    kept = [r for r in fitted if r is not None]
    trimmed = sum(1 for r, f in zip(requests, fitted) if f is not None and f != r)
    return ChatFit(kept, trimmed, len(requests) - len(kept), counted=True)


async def _fit_one(count, request: WorkloadRequest, max_model_len: int,
                   seed: int) -> WorkloadRequest | None:
    """The request with as many of its words as fit beside its output; None if none do."""
    room = max_model_len - request.output_len
    words = request.prompt_len
    for _ in range(TRIES):
        if words < 1 or room < 1:
            return None
        tokens = await count(chat_prompt(seed, request.index, words))
        if tokens <= room:
            return msgspec.structs.replace(request, prompt_len=words)
        words = min(words - 1, int(words * room / tokens))
    return None


class _Counter:
    """The server's token count of one user message (None: it has no /tokenize)."""

    def __init__(self, session: aiohttp.ClientSession, url: str, model: str | None) -> None:
        self.session, self.url, self.model = session, url, model

    async def __call__(self, text: str) -> int | None:
        body = {"messages": [{"role": "user", "content": text}]}
        if self.model:
            body["model"] = self.model
        async with self.session.post(self.url, json=body) as response:
            if response.status == 404:
                return None
            response.raise_for_status()
            return int((await response.json(content_type=None))["count"])
