"""The daemon's per-request log (`--request-log FILE`): one JSON line per request as it
ends, from the controller core's actions -- where it went, whether it was offloaded, how
it ended, its TTFT -- so a live run can be audited request by request (and compared with
the simulator's records, which observe the same actions).

Times are seconds: `arrival` on the daemon's monotonic clock, the rest durations.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from daemon.core.events import Arrived, Moved, Refuse, Send, Settle, Token
from ipc.messages import Origin, Submit


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
    instances: list[int] = field(default_factory=list)
    offloaded: bool = False
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
            case Send(instance_id=instance_id, message=Submit(request_id=rid, origin=Origin.NEW)):
                if rid in self._open:
                    self._open[rid].instances = [instance_id]
            case Moved(request_id=rid, kind=kind, target=target) if rid in self._open:
                entry = self._open[rid]
                entry.instances.append(target)
                entry.offloaded |= kind in (Origin.OFFLOAD, Origin.REROUTE)
            case Token(request_id=rid, ttft=ttft) if rid in self._open:
                entry = self._open[rid]
                entry.output_tokens += 1
                if ttft is not None:
                    entry.ttft = ttft
            case Settle(request_id=rid, outcome=outcome, code=code, e2e=e2e):
                self._write(rid, outcome.value, code.value if code else None, e2e)
            case Refuse(request_id=rid, refusal=refusal):
                self._write(rid, "refused", refusal.value, None)

    def _write(self, request_id: str, outcome: str, code: str | None, e2e: float | None) -> None:
        entry = self._open.pop(request_id, None)
        if entry is None:
            return
        event = entry.arrived
        self._file.write(self._encoder.encode(RequestLogEntry(
            request_id=request_id, arrival=event.now, prompt_tokens=len(event.prompt_token_ids),
            output_tokens=entry.output_tokens, ttft_slo=event.ttft_slo, tbt_slo=event.tbt_slo,
            instances=entry.instances, offloaded=entry.offloaded, outcome=outcome, code=code,
            ttft=entry.ttft, e2e=e2e)) + b"\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_request_log(path: str) -> list[RequestLogEntry]:
    decoder = msgspec.json.Decoder(RequestLogEntry)
    with open(path, "rb") as f:
        return [decoder.decode(line) for line in f if line.strip()]
