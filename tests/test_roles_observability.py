"""What an operator sees of `<n>A` role changes: /health's role and last change, the
metrics' change counter and seconds per role, and the records' serving role.

Covers: daemon/health.py, daemon/metrics.py.
"""
from __future__ import annotations

from types import SimpleNamespace

from daemon.core.events import Settle
from daemon.core.request_state import Outcome
from daemon.health import build_health
from daemon.metrics import Metrics
from ipc.messages import Role
from tests.test_roles_core import changed, core_3a


def supervisor(n: int) -> SimpleNamespace:
    slot = lambda i: SimpleNamespace(instance_id=i, pid=100 + i, restarts=0,  # noqa: E731
                                     state=SimpleNamespace(value="ready"),
                                     config=SimpleNamespace(scheduler=SimpleNamespace(mode="lp")))
    return SimpleNamespace(slots={i: slot(i) for i in range(n)})


def test_health_shows_each_instances_role_and_its_last_change():
    core = core_3a()
    core.roles.switch(1, Role.HP, "a tight class", [])
    changed(core, 1, Role.HP, 5.0)
    health = build_health(core.view, supervisor(3), "m", now=8.0)
    roles = {i.id: (i.role, i.mode) for i in health.instances}
    assert roles == {0: ("lp", "lp"), 1: ("hp", "hp"), 2: ("lp", "lp")}
    change = health.instances[1].role_change
    assert (change.old, change.new, change.reason, change.seconds_ago) == (
        "lp", "hp", "a tight class", 3.0)
    assert health.instances[0].role_change is None


def test_metrics_count_role_changes_and_seconds_per_role():
    core = core_3a()  # ready at 0.0
    metrics = Metrics(dict(core.ledger.role_of))
    core.roles.switch(1, Role.HP, "why", [])
    for action in changed(core, 1, Role.HP, 5.0):
        metrics.observe(action)
    metrics.watch_roles(lambda: core.view.role_seconds(8.0))
    metrics.observe(Settle("a", Outcome.COMPLETED, instance=1))
    text = metrics.render().decode()
    assert 'ascendra_role_changes_total{from="lp",to="hp"} 1.0' in text
    assert 'ascendra_instance_role_seconds{instance="1",role="lp"} 5.0' in text
    assert 'ascendra_instance_role_seconds{instance="1",role="hp"} 3.0' in text
    assert 'ascendra_instance_role_seconds{instance="0",role="lp"} 8.0' in text
    assert 'ascendra_instance_served_total{instance="1",role="hp"} 1.0' in text

