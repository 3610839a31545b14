"""The stream bench's client (bench/micro/stream_client.py): it counts SSE events however the
bytes are split, and opens every connection before its clock starts.

Covers: bench/micro/stream_client.py.
"""
from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestServer

from bench.micro.stream_client import EventCounter, run_streams


def test_the_bench_counter_counts_events_split_anywhere():
    body = b"".join(b'data: {"t": %d}\n\n' % i for i in range(7)) + b"data: [DONE]\n\n"
    for size in (1, 2, 3, 5, 14, len(body)):
        counter = EventCounter(start=0.0)
        for at in range(0, len(body), size):
            counter.feed(body[at:at + size], now=float(at))
        assert counter.events == 8 and counter.done, size
    cut = EventCounter(start=0.0)
    cut.feed(body[:-3], now=1.0)
    assert cut.events == 7 and not cut.done


async def test_the_bench_client_opens_its_connections_before_the_clock_starts():
    """Every stream goes over a connection opened by the untimed warm-up (a burst of
    connects inside the timed run could wait a second on TCP's SYN retry)."""
    ports: dict[str, set[int]] = {"GET": set(), "POST": set()}

    def record(request: web.Request) -> None:
        ports[request.method].add(request.transport.get_extra_info("peername")[1])

    async def health(request: web.Request) -> web.Response:
        record(request)
        await asyncio.sleep(0.01)  # every warm-up request in flight at once
        return web.json_response({"status": "ok"})

    async def completions(request: web.Request) -> web.StreamResponse:
        record(request)
        tokens = (await request.json())["max_tokens"]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"text":"a"}]}\n\n' * tokens
                             + b'data: {"choices":[],"usage":{"completion_tokens":%d}}\n\n'
                             % tokens + b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", completions)
    async with TestServer(app, host="127.0.0.1") as server:
        run = await run_streams(str(server.make_url("")).rstrip("/"), 8, 5, keep=2)
    assert run.problems == [] and run.token_events == 8 * 5 and run.texts == ["aaaaa"] * 2
    assert len(ports["GET"]) == 8 and ports["POST"] <= ports["GET"]
