"""The HTTP edge (daemon/http_guard.py) in-process: a slow-loris client trickling headers and
one trickling a body are cut off at their deadline, the connection cap answers 503, and
ordinary keep-alive and long streams are left alone.

Covers: daemon/http_guard.py.
"""
from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiohttp import web

from daemon.http_guard import ConnectionGuard

HEADERS = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


async def _echo(request: web.Request) -> web.Response:
    return web.json_response({"bytes": len(await request.read())})


async def _stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    for _ in range(6):  # 1.2 s in all, longer than the header deadline
        await response.write(b"tick\n")
        await asyncio.sleep(0.2)
    await response.write_eof()
    return response


@pytest.fixture
async def serve():
    runners = []

    async def start(**limits) -> tuple[ConnectionGuard, int]:
        guard = ConnectionGuard(**{"header_timeout": 0.5, "body_timeout": 0.5,
                                   "max_connections": 100, **limits})
        app = web.Application(middlewares=[guard.middleware], client_max_size=1000)
        app.router.add_post("/echo", _echo)
        app.router.add_get("/stream", _stream)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        runners.append(runner)
        await guard.site(runner, "127.0.0.1", 0).start()
        return guard, runner.addresses[0][1]

    yield start
    for runner in runners:
        await runner.cleanup()


async def _trickle(writer: asyncio.StreamWriter, data: bytes, interval: float) -> int:
    """Bytes of `data` sent, one every `interval`, until all are or the server closes."""
    for i in range(len(data)):
        try:
            writer.write(data[i:i + 1])
            await writer.drain()
        except ConnectionError:
            return i  # the server closed it: what the test waits for
        await asyncio.sleep(interval)
    return len(data)


async def _closed_after(port: int, opening: bytes, trickled: bytes, interval: float,
                        limit: float = 5.0) -> tuple[float, bytes, bool]:
    """Seconds until the server closes a connection that sends `opening`, then `trickled`
    a byte every `interval`; what it answered; and whether the trickle was still going
    then (the server cut it, rather than waiting it out). Fails after `limit` seconds."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.monotonic()
    writer.write(opening)
    sender = asyncio.create_task(_trickle(writer, trickled, interval))
    answer = b""
    try:
        async with asyncio.timeout(limit):
            while chunk := await reader.read(4096):
                answer += chunk
    except TimeoutError:
        pytest.fail(f"the connection was still open after {limit} s")
    except ConnectionError:
        pass
    finally:
        # the trickle had more to send: cancelled now, or ended by the server's close
        trickling = not sender.done() or sender.result() < len(trickled)
        sender.cancel()
        writer.close()
    return time.monotonic() - start, answer, trickling


async def _get(port: int, reader=None, writer=None, path: str = "/stream"):
    if reader is None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    return reader, writer, head


async def test_slow_loris_headers_are_cut_at_the_header_timeout(serve):
    guard, port = await serve(header_timeout=0.5)
    # the trickle would last 40 s: cut while it still goes, and not before the timeout
    seconds, answer, trickling = await _closed_after(
        port, b"", HEADERS + b"X-Slow: " + b"a" * 400, 0.1, limit=30)
    assert seconds >= 0.4 and trickling and answer == b"", (seconds, trickling, answer)
    assert guard.num_timed_out == 1


async def test_slow_body_gets_408_at_the_body_timeout(serve):
    guard, port = await serve(body_timeout=0.5)
    seconds, answer, trickling = await _closed_after(
        port, HEADERS + b"Content-Length: 400\r\n\r\n", b"{" + b" " * 399, 0.1, limit=30)
    assert seconds >= 0.4 and trickling, (seconds, trickling)  # the trickle would last 40 s
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and b"Connection: close" in head
    assert json.loads(body)["error"]["code"] == "body_timeout"
    assert guard.num_timed_out == 1


@pytest.mark.slow
async def test_prompt_requests_keep_alive_and_long_streams_are_not_cut(serve):
    _, port = await serve(header_timeout=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b'{"a": 1}'
    for _ in range(3):  # one connection, several requests, each well within the deadline
        writer.write(HEADERS + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        assert json.loads(await reader.readexactly(length)) == {"bytes": len(body)}
        await asyncio.sleep(0.3)
    # a 1.2 s stream on the same connection: the header deadline does not run meanwhile
    _, _, head = await _get(port, reader, writer)
    assert head.startswith(b"HTTP/1.1 200")
    assert (await reader.readuntil(b"0\r\n\r\n")).count(b"tick") == 6
    # idle past the deadline: closed
    async with asyncio.timeout(2):
        assert await reader.read() == b""
    writer.close()


async def test_connections_beyond_the_cap_get_503_and_room_frees_up(serve):
    guard, port = await serve(max_connections=2, header_timeout=5)
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
    async with asyncio.timeout(2):
        while guard.num_connections < 2:
            await asyncio.sleep(0.01)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    async with asyncio.timeout(2):
        answer = await reader.read()  # answered and closed without a request
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head
    assert json.loads(body)["error"]["code"] == "too_many_connections"
    assert guard.num_refused == 1
    writer.close()
    held[0][1].close()
    async with asyncio.timeout(2):
        while guard.num_connections > 1:
            await asyncio.sleep(0.01)
    _, writer, head = await _get(port)
    assert head.startswith(b"HTTP/1.1 200")
    writer.close()
    held[1][1].close()


async def test_a_body_over_the_size_limit_is_still_413(serve):
    _, port = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(HEADERS + b"Content-Length: 5000\r\n\r\n" + b" " * 5000)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
    assert head.startswith(b"HTTP/1.1 413"), head
    writer.close()
