"""What the controller predicts of one instance's prefill backlog (docs/design.md §5.6):
the waiting room (daemon/core/waiting_room.py) keeps one per ready instance.

Backlog of an instance, in prompt tokens = those it reported waiting after its last step
(`InstanceLoad`) + those of every Submit sent to it that it had not taken in then (the
load report counts the Submits it accepted). In seconds: tokens / its prefill rate --
the prompt tokens per second it measured while saturated, decodes sharing its steps
included -- or, before it has measured one, its performance model's rate for prefill
alone (the prefill curve it sent in Ready).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ipc.messages import InstanceLoad, Ready
from engines.perf.prefill_curve import curve_seconds

#: The least share of its model's prefill-alone rate an instance is taken to run at.
MIN_RATE_SHARE = 0.25


@dataclass
class Backlog:
    model_rate: float                   # tokens/s of prefill alone, from its curve
    measured_rate: float = 0.0          # tokens/s while saturated, from its reports
    reported: int = 0                   # prompt tokens waiting at its last report
    reported_sheddable: int = 0         # ... of sheddable requests (priority < 0)
    accepted: int = 0
    sent: int = 0
    #: (sequence number, prompt tokens, sheddable) of the Submits it has not taken in yet
    in_transit: deque = field(default_factory=deque)

    @property
    def rate(self) -> float:
        """The measured rate, but never under MIN_RATE_SHARE of prefill alone: a stall (no
        KV free for a while) must not make the instance look stopped for ever."""
        if not self.measured_rate:
            return self.model_rate
        return max(self.measured_rate, MIN_RATE_SHARE * self.model_rate)

    @property
    def tokens(self) -> int:
        return self.reported + sum(n for _, n, _ in self.in_transit)

    @property
    def sheddable_tokens(self) -> int:
        """Of `tokens`, those of sheddable requests (served after every other)."""
        return self.reported_sheddable + sum(n for _, n, shed in self.in_transit if shed)

    def add(self, tokens: int, sheddable: bool) -> None:
        self.in_transit.append((self.sent, tokens, sheddable))
        self.sent += 1

    def report(self, load: InstanceLoad) -> None:
        self.reported, self.accepted = load.queued_prefill_tokens, load.accepted
        self.reported_sheddable = load.queued_sheddable_tokens
        self.measured_rate = load.prefill_rate or self.measured_rate
        while self.in_transit and self.in_transit[0][0] < self.accepted:
            self.in_transit.popleft()


def model_rate(ready: Ready) -> float:
    """Prompt tokens per second of prefill alone, as the instance's curve predicts."""
    budget = ready.token_budget or 2048
    return budget / curve_seconds(ready.prefill_curve, budget)
