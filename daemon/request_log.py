"""The daemon's per-request log (`--request-log FILE`): one JSON line per request as it
ends, from the controller core's actions -- where it went, whether it was offloaded, how
it ended, its TTFT -- so a live run can be audited request by request (and compared with
the simulator's records, which observe the same actions).

Times are seconds: `arrival` on the daemon's monotonic clock, the rest durations.
"""
from __future__ import annotations

from dataclasses import dataclass

import msgspec

from daemon.core.events import Arrived, Refuse, Settle, Tokens


class RequestLogEntry(msgspec.Struct, kw_only=True):
    request_id: str
    arrival: float
    prompt_tokens: int
    output_tokens: int
    ttft_slo: float | None          # None: the server's default
    tbt_slo: float | None
    instances: list[int]            # every instance that held it, in order
    offloaded: bool
    outcome: str                    # completed | cancelled | dropped | rejected | errored | refused
    code: str | None                # why, when it did not complete
    ttft: float | None
    e2e: float | None               # arrival to last token


@dataclass
class _Open:
    arrived: Arrived
    output_tokens: int = 0
    ttft: float | None = None


class RequestLog:
    """Writes an entry per request to `path` (appends; flushed per line)."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "ab")  # noqa: SIM115 -- kept open for the daemon's life
        self._encoder = msgspec.json.Encoder()
        self._open: dict[str, _Open] = {}

    def arrived(self, event: Arrived) -> None:
        self._open[event.request_id] = _Open(event)

    def observe(self, action) -> None:
        match action:
            case Tokens(tokens=tokens, ttfts=ttfts):
                self._tokens(tokens.request_ids, ttfts)
            case Settle(request_id=rid, outcome=outcome, code=code, e2e=e2e):
                self._write(rid, outcome.value, code.value if code else None, e2e,
                            list(action.instances), action.offloaded)
            case Refuse(request_id=rid, refusal=refusal):
                self._write(rid, "refused", refusal.value, None)

    def _tokens(self, request_ids: list[str], ttfts: dict[int, float]) -> None:
        """A step's tokens (`ttfts`: the first tokens' positions and TTFTs)."""
        for i, rid in enumerate(request_ids):
            entry = self._open.get(rid)
            if entry is not None:
                entry.output_tokens += 1
                if i in ttfts:
                    entry.ttft = ttfts[i]

    def _write(self, request_id: str, outcome: str, code: str | None, e2e: float | None,
               instances: list[int] | None = None, offloaded: bool = False) -> None:
        """Its line; where it went is its `Settle`'s (the core's `Tracked.instances`)."""
        entry = self._open.pop(request_id, None)
        if entry is None:
            return
        event = entry.arrived
        self._file.write(self._encoder.encode(RequestLogEntry(
            request_id=request_id, arrival=event.now, prompt_tokens=len(event.prompt_token_ids),
            output_tokens=entry.output_tokens, ttft_slo=event.ttft_slo, tbt_slo=event.tbt_slo,
            instances=instances or [], offloaded=offloaded, outcome=outcome, code=code,
            ttft=entry.ttft, e2e=e2e)) + b"\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_request_log(path: str) -> list[RequestLogEntry]:
    decoder = msgspec.json.Decoder(RequestLogEntry)
    with open(path, "rb") as f:
        return [decoder.decode(line) for line in f if line.strip()]
