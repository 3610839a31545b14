"""A cheap SSE counting client: N concurrent streaming completions, events counted per stream.

Built to measure the server, so it spends as little CPU per token as it can: it reads
each response in whatever pieces arrive and counts event ends (the blank line after
each `data:` line; JSON carries no raw newline, so every `\\n\\n` ends one event) instead
of parsing events. Only the first `keep` streams are kept whole and parsed afterwards,
for their text (to check two servers stream the same tokens) and their usage count.
A stream of M tokens must be exactly M token events, a usage event and `data: [DONE]`.

Its N connections are opened before the clock starts (`_connect`, a GET /health on each,
kept alive): N connects at once can overflow the server's listen queue while its event
loop is busy, and a dropped SYN is retried only after a second, so a run would measure
TCP's retry timer instead of the stream.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp

DONE = b"data: [DONE]\n\n"


@dataclass
class StreamRun:
    """One run: how many token events arrived, in how long, and what it cost the client."""
    token_events: int = 0
    seconds: float = 0.0
    client_cpu_seconds: float = 0.0
    #: Reads of the response bodies, all streams (tokens per read: how many came at once).
    reads: int = 0
    #: Per stream, in seconds: from the run's start to its first read (its first token)
    #: and to the mean arrival of its tokens (a read of k events counts k times), and the
    #: longest gap between two of its reads (the longest its client saw nothing).
    first_token_seconds: list[float] = field(default_factory=list)
    mean_token_seconds: list[float] = field(default_factory=list)
    longest_gap_seconds: list[float] = field(default_factory=list)
    #: The text of each kept stream, in request order.
    texts: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def prompt_of(index: int) -> str:
    """Request `index`'s prompt: its own, so the sim executor gives it its own tokens."""
    return f"stream number {index} of the throughput run"


async def run_streams(url: str, num_requests: int, num_tokens: int, keep: int = 4) -> StreamRun:
    """Send `num_requests` streams of `num_tokens` tokens to `url`'s /v1/completions at
    once; wait for every one."""
    run = StreamRun()
    kept: dict[int, bytes] = {}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await _connect(session, url, num_requests)
        cpu, start = time.process_time(), time.perf_counter()
        streams = await asyncio.gather(*(
            _one(session, url + "/v1/completions", i, num_tokens, kept if i < keep else None, start)
            for i in range(num_requests)))
        run.seconds = time.perf_counter() - start
        run.client_cpu_seconds = time.process_time() - cpu
    for index, stream in enumerate(streams):
        run.reads += stream.reads
        run.first_token_seconds.append(stream.first - start)
        run.mean_token_seconds.append(stream.total_time / max(stream.events, 1))
        run.longest_gap_seconds.append(stream.longest_gap)
        if not stream.done or stream.events != num_tokens + 2:
            run.problems.append(f"stream {index}: {stream.events} events (want {num_tokens} "
                                f"tokens, usage, [DONE])"
                                f"{'' if stream.done else ', no [DONE] at the end'}")
        run.token_events += max(stream.events - 2, 0)
    for index in sorted(kept):
        text, problem = _text_of(kept[index], num_tokens)
        run.texts.append(text)
        if problem:
            run.problems.append(f"stream {index}: {problem}")
    return run


async def _connect(session: aiohttp.ClientSession, url: str, count: int) -> None:
    """Open `count` keep-alive connections to `url` (all at once, so none is reused)."""
    async def health() -> None:
        async with session.get(url + "/health") as resp:
            await resp.read()

    await asyncio.gather(*(health() for _ in range(count)))


class EventCounter:
    """Counts the events of an SSE body fed in arbitrary pieces, and the time they came."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.events = self.reads = 0
        self.first = self.last = self.longest_gap = self.total_time = 0.0
        self._newline_tail = False  # the last piece ended in "\n" (maybe half of "\n\n")
        self._tail = b""

    def feed(self, piece: bytes, now: float) -> None:
        if not piece:
            return
        self.reads += 1
        if self.reads > 1:
            self.longest_gap = max(self.longest_gap, now - self.last)
        self.first, self.last = self.first or now, now
        ended = piece.count(b"\n\n") + (self._newline_tail and piece[0] == 0x0A)
        self.events += ended
        self.total_time += ended * (now - self.start)
        self._newline_tail = piece[-1] == 0x0A
        self._tail = (self._tail + piece)[-len(DONE):] if len(piece) < len(DONE) \
            else piece[-len(DONE):]

    @property
    def done(self) -> bool:
        """It ended with `data: [DONE]`."""
        return self._tail == DONE


async def _one(session: aiohttp.ClientSession, url: str, index: int, num_tokens: int,
               kept: dict[int, bytes] | None, start: float) -> EventCounter:
    body = {"prompt": prompt_of(index), "max_tokens": num_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0.0, "stream_options": {"include_usage": True}}
    counter, pieces = EventCounter(start), []
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            return counter
        async for piece in resp.content.iter_any():
            counter.feed(piece, time.perf_counter())
            if kept is not None:
                pieces.append(piece)
    if kept is not None:
        kept[index] = b"".join(pieces)
    return counter


def _text_of(raw: bytes, num_tokens: int) -> tuple[str, str]:
    """A kept stream's text and, if something is off, what."""
    datas = [e[len(b"data: "):] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
    texts, usage = [], None
    for data in datas[:-1]:  # the last is [DONE]
        chunk = json.loads(data)
        if chunk.get("usage"):
            usage = chunk["usage"]["completion_tokens"]
        for choice in chunk["choices"]:
            texts.append(choice["text"])
    if usage != num_tokens:
        return "".join(texts), f"usage says {usage} completion tokens, not {num_tokens}"
    return "".join(texts), ""
