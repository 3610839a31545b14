"""The HTTP edge against slow and surplus clients: a header deadline, a body deadline and a
cap on open connections.

aiohttp's server reads headers and bodies as slowly as a client sends them, so a client
trickling a byte a second would hold a connection for minutes. Here:

* **headers**: a connection must have a request's headers in within `header_timeout` of
  connecting or of its previous response ending, else it is closed (so an idle keep-alive
  connection also closes then);
* **body**: once the headers are in, the body must arrive within `body_timeout`, else the
  client gets 408 and the connection is closed;
* **connections**: beyond `max_connections` open at once, a new connection gets 503 and is
  closed before anything is read from it.

`ConnectionGuard.site(runner, host, port)` listens with every connection wrapped;
`ConnectionGuard.middleware` (append it last, inside the API's own) keeps the deadlines.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from aiohttp import web

from daemon.responses import error_body

log = logging.getLogger(__name__)
#: Seconds between two warnings that connections are being refused.
REFUSAL_LOG_INTERVAL = 10.0


def _refusal(max_connections: int) -> bytes:
    body = json.dumps(error_body(
        f"too many connections: at most {max_connections} may be open at once; retry later",
        503, code="too_many_connections")).encode()
    head = ("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n")
    return head.encode() + body


class ConnectionGuard:
    def __init__(self, header_timeout: float, body_timeout: float, max_connections: int) -> None:
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.max_connections = max_connections
        self.num_refused = 0        # connections refused for the cap, in all
        self.num_timed_out = 0      # connections closed for a header or body deadline
        self._open: dict[object, _Connection] = {}  # by transport
        self._refusal = _refusal(max_connections)
        self._last_refusal_log = -REFUSAL_LOG_INTERVAL

    @property
    def num_connections(self) -> int:
        return len(self._open)

    def site(self, runner: web.BaseRunner, host: str, port: int) -> web.BaseSite:
        return _GuardedSite(runner, host, port, self)

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        connection = self._open.get(request.transport)
        if connection is not None:
            connection.request_started()
        try:
            if request.body_exists and not await self._read_body(request):
                return await self._body_too_slow(request)
            return await handler(request)
        finally:
            if connection is not None:
                connection.request_ended()

    async def _read_body(self, request: web.Request) -> bool:
        """Read the whole body (the handler then reads it from memory); False if it did
        not arrive in time. Past client_max_size this raises 413 as the handler would."""
        try:
            await asyncio.wait_for(request.read(), self.body_timeout)
        except TimeoutError:  # asyncio's, since Python 3.11
            return False
        return True

    async def _body_too_slow(self, request: web.Request) -> web.StreamResponse:
        self.num_timed_out += 1
        log.info("closing a connection whose request body took over %.0f s", self.body_timeout)
        response = web.json_response(error_body(
            f"the request body did not arrive within {self.body_timeout:g} s", 408,
            code="body_timeout"), status=408)
        response.force_close()
        await response.prepare(request)
        await response.write_eof()
        if request.transport is not None:
            request.transport.close()  # sends what is written, then closes
        return response

    # ---- connection bookkeeping (called by _Connection) --------------------------------
    def _admit(self, connection: _Connection) -> bool:
        if len(self._open) >= self.max_connections:
            self.num_refused += 1
            now = time.monotonic()
            if now - self._last_refusal_log >= REFUSAL_LOG_INTERVAL:
                self._last_refusal_log = now
                log.warning("refusing connections: %d open, the limit (max_connections); "
                            "%d refused so far", len(self._open), self.num_refused)
            return False
        self._open[connection.transport] = connection
        return True

    def _forget(self, connection: _Connection) -> None:
        self._open.pop(connection.transport, None)


class _Connection(asyncio.Protocol):
    """One client connection: aiohttp's request handler inside, a header deadline around.

    The deadline runs while no request is being handled -- from connecting, and again from
    the end of each response -- and closes the connection when it passes.
    """

    def __init__(self, guard: ConnectionGuard, server: web.Server) -> None:
        self.guard = guard
        self.server = server
        self.handler: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.num_requests = 0  # being handled now
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        if not self.guard._admit(self):
            transport.write(self.guard._refusal)
            transport.close()
            return
        self.handler = self.server()
        self.handler.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.handler is not None:
            self.handler.data_received(data)

    def eof_received(self):
        return self.handler.eof_received() if self.handler is not None else None

    def connection_lost(self, exc) -> None:
        self._disarm()
        if self.handler is not None:
            self.guard._forget(self)
            self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.handler is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.handler is not None:
            self.handler.resume_writing()

    def request_started(self) -> None:
        self.num_requests += 1
        self._disarm()

    def request_ended(self) -> None:
        self.num_requests -= 1
        if self.num_requests == 0:
            self._arm()

    def _arm(self) -> None:
        self._disarm()
        loop = asyncio.get_running_loop()
        self.deadline = loop.call_later(self.guard.header_timeout, self._expire)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expire(self) -> None:
        self.deadline = None
        if self.num_requests == 0 and self.transport is not None \
                and not self.transport.is_closing():
            self.guard.num_timed_out += 1
            log.debug("closing a connection: no request headers within %.0f s",
                      self.guard.header_timeout)
            self.transport.close()


class _GuardedSite(web.BaseSite):
    """A TCP site whose connections are `_Connection`s (aiohttp's TCPSite, wrapped)."""

    __slots__ = ("_guard", "_host", "_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int,
                 guard: ConnectionGuard) -> None:
        super().__init__(runner)
        self._host, self._port, self._guard = host, port, guard

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        guard = self._guard
        loop = asyncio.get_running_loop()
        # A listen queue as long as the connections it may hold (asyncio's default is 100):
        # a burst of connects while the loop is busy would overflow it, and a dropped SYN
        # is retried only a second later.
        self._server = await loop.create_server(lambda: _Connection(guard, server),
                                                self._host, self._port, reuse_address=True,
                                                backlog=guard.max_connections)
