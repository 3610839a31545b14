"""Every way the daemon turns a request away before its first token, as a client and a
dashboard see it (issue #59): a 503 whose `code` names the reason, with a Retry-After of
at least a second, and one `ascendra_dropped_total` series per reason -- each driven
through the real controller core, its actions through the daemon's metrics and errors.

Covers: daemon/metrics.py, daemon/errors.py, daemon/core/controller_core.py, daemon/core/queue_ttl.py, ipc/api_codes.py.
"""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from daemon.core.controller_config import ControllerConfig
from daemon.core.controller_core import ControllerCore
from daemon.core.events import (
    Arrived, Drain, FromInstance, InstanceDown, Refuse, Settle, StartAccepting, StartTimer,
    TimerFired,
)
from daemon.errors import refusal_error, settle_error
from daemon.metrics import Metrics
from ipc.messages import Role
from ipc.params import SamplingParams
from tests.test_controller_core import HP, LP0, LP1, arrive, core_late, ready, report


def _turned_away(actions) -> list:
    return [a for a in actions if isinstance(a, (Refuse, Settle))]


def _every_reason() -> list:
    """One request turned away for each reason, in the order a box's life meets them."""
    core = ControllerCore({0: Role.PEER}, ControllerConfig(max_queued_requests=1))
    out = arrive(core, "early")                                   # starting
    core.handle(FromInstance(0.0, ready(0, Role.PEER)))
    core.handle(StartAccepting(0.0))
    accepted = core.handle(Arrived(1.0, "short-lived", [5, 6, 7], SamplingParams(max_tokens=4),
                                   ttl=0.2))
    out += arrive(core, "one-too-many")                           # queue_full
    [timer] = [a for a in accepted if isinstance(a, StartTimer)]
    out += core.handle(TimerFired(timer.at, timer.timer))         # ttl_expired
    core.handle(InstanceDown(2.0, 0, exit_code=-9))
    out += arrive(core, "orphan", now=2.5)                        # no_instance
    core.handle(FromInstance(3.0, ready(0, Role.PEER, pid=2)))
    core.handle(Drain(4.0, timeout=1.0))
    out += arrive(core, "late-comer", now=4.5)                    # shutting_down
    shedding = core_late(shed="drop")
    for i in (LP0, LP1, HP):
        report(shedding, i, 0.5, accepted=0, queued_seconds=5.0)
    out += arrive(shedding, "hopeless", prompt=[5] * 100)         # ttft_slo_missed
    return _turned_away(out)


def test_each_reason_is_a_503_naming_it_with_a_retry_after():
    answers = {a.request_id: (refusal_error(a) if isinstance(a, Refuse) else settle_error(a))
               for a in _every_reason()}
    codes = {rid: (e.status, e.code) for rid, e in answers.items()}
    assert codes == {"early": (503, "unavailable"), "one-too-many": (503, "queue_full"),
                     "short-lived": (503, "ttl_expired"), "orphan": (503, "unavailable"),
                     "late-comer": (503, "shutting_down"),
                     "hopeless": (503, "ttft_slo_missed")}
    assert all(int(e.headers["Retry-After"]) >= 1 for e in answers.values())


def test_each_reason_is_counted_under_its_own_name():
    metrics = Metrics({0: Role.PEER})
    for action in _every_reason():
        metrics.observe(action)
    dropped = {s.labels["reason"]: s.value
               for f in text_string_to_metric_families(metrics.render().decode())
               if f.name == "ascendra_dropped" for s in f.samples if s.name.endswith("_total")}
    assert dropped == {"starting": 1, "queue_full": 1, "ttl_expired": 1, "no_instance": 1,
                       "shutting_down": 1, "ttft_slo_missed": 1}
