"""The class floor over SLO classes (`class_floor_by = "slo"`, policies/slo_class_floor.py):
classes are the requests' TTFT targets, and a class under its floor is favoured -- planned
behind favoured work only, not behind the LPs' backlogs, and bound at once -- so it is
kept where it would have been dropped.

Covers: policies/slo_class_floor.py, policies/global_queue.py, daemon/core/waiting_room.py.
"""
from __future__ import annotations

import msgspec
import pytest

from policies.class_floor import MIN_OUTCOMES
from policies.global_queue import Lane, Shed, Waiting, plan
from policies.slo_class_floor import SloClasses, target_key


def test_classes_are_ttft_targets_numbered_as_first_seen():
    classes = SloClasses(floor=0.8)
    for target in (5.1, 1.275, 76.5, 1.2750000001, 5.1):
        classes.arrived(target_key(target))
    assert [classes.of(target_key(t)) for t in (5.1, 1.275, 76.5)] == [0, 1, 2]
    assert len(classes.outcomes) == 3          # float noise is the same target


def test_the_class_under_its_floor_is_protected_but_not_in_bursts():
    classes = SloClasses(floor=0.8)
    interactive, standard = target_key(1.275), target_key(5.1)
    for i in range(MIN_OUTCOMES):
        classes.answered(interactive, met=i % 2 == 0)       # 50 %
        classes.answered(standard, met=True)
    assert classes.protected() == frozenset({classes.of(interactive)})
    classes.in_bursts = True
    assert classes.protected() == frozenset()
    assert SloClasses(floor=0.0).protected() == frozenset()  # no floor: off


def test_a_favoured_request_jumps_the_lps_backlog_and_the_rest_waits_behind_it():
    """An LP 1 s behind: an interactive prompt (0.5 s, due in 1 s) misses behind its
    backlog and is dropped; favoured (its class under the floor) it is served first and
    kept, and the standard request, due in 5 s, still fits behind both."""
    lane = [Lane(0, 1.0)]
    interactive = Waiting("i", 0.0, 1.0, 0.5, 0.5, klass=1)
    standard = Waiting("s", 0.0, 5.0, 0.6, 0.6, klass=0)
    plain = plan([interactive, standard], lane, [], now=0.0, bound=1e9, shed=Shed.DROP)
    assert [x.key for x in plain.shed] == ["i"]
    first = Waiting("i", 0.0, 1.0, 0.5, 0.5, klass=1, favoured=True)
    out = plan([first, standard], lane, [], now=0.0, bound=1e9, shed=Shed.DROP,
               protected=frozenset({1}))
    assert out.shed == [] and sorted(x.key for x, _ in out.to_lp) == ["i", "s"]


def test_a_favoured_request_is_bound_past_the_lps_backlog_bound_where_least_is_ahead():
    """Both LPs are past the bound (1 s): a standard request waits at the controller
    (late binding); a favoured one is bound at once with `favoured_first` -- its instance
    serves it before that backlog -- on the LP with less ahead of it."""
    lanes = [Lane(0, 3.0), Lane(1, 2.0)]
    standard = Waiting("s", 0.0, 9.0, 0.6, 0.6, klass=0)
    first = Waiting("i", 0.0, 2.0, 0.3, 0.3, klass=1, favoured=True)
    out = plan([first, standard], lanes, [], now=0.0, bound=1.0, shed=Shed.DROP,
               protected=frozenset({1}), favoured_first=True)
    assert [(x.key, lp) for x, lp in out.to_lp] == [("i", 1)]
    assert [x.key for x in out.order] == ["s"]
    waits = plan([first, standard], lanes, [], now=0.0, bound=1.0, shed=Shed.DROP,
                 protected=frozenset({1}))
    assert waits.to_lp == [] and [x.key for x in waits.order] == ["i", "s"]


def _core(by: str):
    from daemon.core.controller_config import ControllerConfig, SloConfig
    from daemon.core.controller_core import ControllerCore
    from daemon.core.events import FromInstance, StartAccepting
    from ipc.messages import Role
    from tests.test_controller_core import CURVE, ready

    core = ControllerCore({0: Role.LP, 1: Role.LP},
                          ControllerConfig(global_queue=True, class_floor=0.8,
                                           class_floor_by=by),
                          SloConfig(ttft_slo=2.0, tbt_slo=0.1))
    for i in range(2):
        core.handle(FromInstance(0.0, msgspec.structs.replace(
            ready(i, Role.LP, max_model_len=4096), prefill_curve=CURVE, token_budget=100)))
    core.handle(StartAccepting(0.0))
    return core


def _submitted(core, request_id: str, ttft_slo: float):
    from daemon.core.events import Arrived, Send
    from ipc.messages import Submit
    from ipc.params import SamplingParams

    actions = core.handle(Arrived(1.0, request_id, [5] * 100, SamplingParams(max_tokens=4),
                                  ttft_slo=ttft_slo))
    sent = [a.message for a in actions if isinstance(a, Send) and isinstance(a.message, Submit)]
    assert len(sent) == 1
    return sent[0]


@pytest.mark.parametrize("by", ["slo", "prompt"])
def test_the_controller_favours_the_requests_of_an_slo_class_under_its_floor(by):
    """Twenty interactive requests (TTFT 0.5 s) on record, half missed: with the floor
    over SLO classes the next interactive request goes out favoured (its instance serves
    it first), a standard one (2 s) does not; over prompt lengths neither is."""
    core = _core(by)
    for i in range(MIN_OUTCOMES):
        core.room.classes.answered(target_key(0.5) if by == "slo" else 100, met=i % 2 == 0)
    assert _submitted(core, "interactive", 0.5).favoured is (by == "slo")
    assert _submitted(core, "standard", 2.0).favoured is False
