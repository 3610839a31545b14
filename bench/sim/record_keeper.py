"""Per-request records from the controller core's actions: the simulator's observer.

The daemon's Prometheus metrics (`daemon/metrics.py`) observe the same actions, so a
simulated run measures what the daemon would report: a token counts when it reaches
the controller (a step's in one `Tokens` action), a request ends with its `Settle`
(or `Refuse`).
"""
from __future__ import annotations

from bench.records.schema import RequestRecord, failure_outcome
from bench.records.results import is_good
from daemon.core.controller_config import SloConfig
from daemon.core.events import EspChanged, Moved, Refuse, RoleSwitched, Send, Settle, Tokens
from daemon.core.request_state import Outcome
from ipc.api_codes import REFUSAL_CODES
from ipc.messages import Origin, Submit, SubmitPrefilled

#: How the core's outcomes read in a run's records.
RECORD_OUTCOMES = {Outcome.COMPLETED: "completed", Outcome.DROPPED: "dropped",
                   Outcome.REJECTED: "errored", Outcome.ERRORED: "errored",
                   Outcome.CANCELLED: "errored"}


class RecordKeeper:
    def __init__(self, records: dict[str, RequestRecord], slo: SloConfig = SloConfig(),
                 watched: range = range(0)) -> None:
        self.records = records
        self.slo = slo
        #: Record indices whose misses are counted (a steady-state run's measured ones).
        self.watched = watched
        self.misses = 0
        #: An `<n>A` layout's role changes, in order.
        self.role_switches: list[RoleSwitched] = []
        #: Each record's `token_times` by request id: a step's loop appends to them
        #: without a look at the records.
        self._token_times = {request_id: record.token_times
                             for request_id, record in records.items()}

    def add(self, request_id: str, record: RequestRecord) -> None:
        """A request's record, made after the keeper (one a fleet's gateway sent on)."""
        self.records[request_id] = record
        self._token_times[request_id] = record.token_times

    def tokens(self, action: Tokens, now: float) -> None:
        """A step's tokens, all at `now`: each one's time, its request's first token and
        finish reason."""
        records, request_ids, times = self.records, action.tokens.request_ids, self._token_times
        for request_id in request_ids:
            times[request_id].append(now)
        for i in action.ttfts:
            records[request_ids[i]].first_token_time = now
        for i, reason in action.tokens.finished.items():
            records[request_ids[i]].finish_reason = reason.value

    def observe(self, action, now: float) -> None:
        if type(action) is Tokens:  # the hot path: one per instance step
            self.tokens(action, now)
            return
        self._record(action, now)
        if isinstance(action, (Settle, Refuse)):
            record = self.records[action.request_id]
            if record.index in self.watched and not is_good(record, self.slo.ttft_slo,
                                                             self.slo.tbt_slo):
                self.misses += 1

    def _record(self, action, now: float) -> None:
        match action:
            case Settle(request_id=request_id, outcome=outcome, code=code, message=message,
                        instance=instance):
                record = self.records[request_id]
                record.outcome = RECORD_OUTCOMES[outcome]
                record.end_time, record.instance = now, instance
                record.cached_tokens = action.cached_tokens
                if action.role is not None:
                    record.role = action.role.value
                if code is not None:
                    record.error_code, record.error = code.value, message
            case Refuse(request_id=request_id, refusal=refusal, message=message):
                record = self.records[request_id]  # the code its client would get
                record.error_code, record.error = REFUSAL_CODES[refusal], message
                record.outcome, record.end_time = failure_outcome(record.error_code), now
            case Send(instance_id=instance_id, message=Submit(request_id=request_id,
                                                              origin=Origin.NEW)):
                self.records[request_id].instances = [instance_id]
            case Send(instance_id=instance_id, message=SubmitPrefilled(request_id=request_id)):
                record = self.records[request_id]  # P/D: on to a decode instance
                record.instances = [*record.instances, instance_id]
            case Moved(request_id=request_id, kind=kind, target=target):
                record = self.records[request_id]
                record.instances = [*record.instances, target]
                if kind in (Origin.OFFLOAD, Origin.RESCUE, Origin.REROUTE):
                    record.offloaded = True
            case RoleSwitched():
                self.role_switches.append(action)
            case EspChanged(request_id=request_id, members=members, formed=True):
                self.records[request_id].esp_group = list(members)
