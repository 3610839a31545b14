"""Reading a server-sent event stream (the `text/event-stream` of a streaming completion)."""
from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator


async def sse_data(lines: AsyncIterable[bytes]) -> AsyncIterator[str]:
    """The `data` of each event, as soon as the blank line that ends it arrives.

    `lines` yields raw lines (an aiohttp response's `.content` does). Comments and other
    fields (`event:`, `id:`) are skipped; several `data:` lines of one event are joined
    with newlines, as the SSE standard says.
    """
    data: list[str] = []
    async for raw in lines:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:  # a stream cut before the final blank line
        yield "\n".join(data)
