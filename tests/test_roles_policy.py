"""The role policy of `<n>A` layouts (policies/roles.py): pure decisions from a window.

Covers: policies/roles.py.
"""
from __future__ import annotations

import numpy as np

from policies.roles import (FAIR_BURST_HP_SHARE, HP, LP, RoleParams, Seat, Window, burstiness,
                            decide, hp_cap, in_bursts, tight_count)

NOW = 100.0
INF = -float("inf")


def seats(*roles: str, since: float = INF, rescued: int = 0) -> list[Seat]:
    return [Seat(i, r, since, backlog=float(i), rescued=rescued if r == HP else 0)
            for i, r in enumerate(roles)]


def window(arrivals=200, tight=0, rescuable=0, seconds=10.0, burstiness=1.4) -> Window:
    return Window(seconds, arrivals, tight, rescuable, burstiness)


def test_tight_slos_are_those_at_most_half_the_upper_quartile():
    assert tight_count([1.0] * 10, 0.5) == 0
    assert tight_count([0.5] * 3 + [2.0] * 5 + [30.0] * 2, 0.5) == 3
    assert tight_count([], 0.5) == 0


def test_a_tight_class_that_is_most_of_the_traffic_stays_tight():
    """60 % interactive (0.5 s) beside standard (2 s) and batch (30 s): the majority's own
    target is the median, but the HP still pays for it (the shifting workload's mixed phase)."""
    assert tight_count([0.5] * 6 + [2.0] * 3 + [30.0], 0.5) == 6
    assert tight_count([0.5] * 9 + [2.0], 0.5) == 0  # nearly one class: nothing to favour


def test_no_hp_pays_without_a_tight_class_and_never_every_instance():
    params = RoleParams()
    assert hp_cap(3, 0.0, params) == 0
    assert hp_cap(3, 0.3, params) == 2
    assert hp_cap(3, 1.0, params) == 2
    assert hp_cap(1, 1.0, params) == 0
    assert hp_cap(8, 0.1, params) == 2


def test_the_hp_cap_follows_the_tight_share_of_the_instances_plus_one():
    """Three instances: one HP up to a sixth tight, then two (1L2H led mixed-slo at 30 %
    tight); eight at mixed-slo's 31 %: three, not the five twice the share would give
    (6L2H and 4L4H lead there, docs/design.md §5.10)."""
    params = RoleParams()
    assert [hp_cap(3, share, params) for share in (0.05, 1 / 6, 0.17, 0.5)] == [1, 1, 2, 2]
    assert hp_cap(8, 0.31, params) == 3
    assert hp_cap(8, 0.5, params) == 5
    assert hp_cap(8, 1.0, params) == 7


def test_a_tight_class_with_rescuable_late_requests_adds_an_hp_on_the_least_loaded_lp():
    change = decide(seats(LP, LP, LP), window(tight=60, rescuable=10), NOW, INF)
    assert change is not None and change.role == HP and change.instance_id == 0
    assert "late but rescuable" in change.reason


def test_late_requests_of_one_slo_class_add_no_hp():
    assert decide(seats(LP, LP, LP), window(tight=0, rescuable=50), NOW, INF) is None


def test_without_a_tight_class_an_hp_goes_back_to_lp():
    change = decide(seats(LP, LP, HP), window(tight=0, rescuable=50), NOW, INF)
    assert change is not None and change.instance_id == 2 and change.role == LP
    assert "no HP pays" in change.reason


def test_hps_go_back_to_lp_when_little_needs_a_rescue_the_least_useful_first():
    busy = decide(seats(LP, HP, HP, rescued=0), window(tight=60, rescuable=20), NOW, INF)
    idle = decide([Seat(0, LP, INF), Seat(1, HP, INF, rescued=1), Seat(2, HP, INF, rescued=0)],
                  window(tight=60, rescuable=0), NOW, INF)
    assert busy is None  # the pool rescues: a second HP that itself rescued none stays
    assert idle is not None and (idle.instance_id, idle.role) == (2, LP)
    assert "only 0 of 200 arrivals" in idle.reason


def test_burstiness_is_the_mean_gap_over_the_median_gap():
    assert burstiness([0.0, 1.0, 2.0, 3.0]) == 1.0                  # evenly spaced
    # bursts of five arrivals 10 ms apart, a burst every 10 s: mean gap 1.7 s, median 10 ms
    bursts = [10.0 * b + 0.01 * i for b in range(6) for i in range(5)]
    assert 150 < burstiness(bursts) < 250
    assert burstiness([5.0, 5.0, 5.0, 9.0]) == float("inf")      # most at the same instant
    assert burstiness([1.0, 2.0]) == 0.0                           # too few gaps to tell


def test_poisson_arrivals_read_far_below_the_burst_ratio_and_gamma_cv4_far_above():
    rng = np.random.default_rng(0)
    steady = np.cumsum(rng.exponential(0.1, 300))                # 10 QPS, 30 s
    bursty = np.cumsum(rng.gamma(1 / 16, 0.4 * 16, 75))          # CV 4, 2.5 QPS
    ratio = RoleParams().burst_ratio
    assert burstiness(list(steady)) < ratio / 5 and burstiness(list(bursty)) > ratio * 2


IN_BURSTS = RoleParams(hps_in_bursts=True)  # the default: HPs in bursts


def test_bursts_add_hps_up_to_a_sixth_of_the_instances_rounded_up_unless_turned_off():
    assert RoleParams().hps_in_bursts
    assert [hp_cap(n, 0.0, IN_BURSTS, bursty=True) for n in (2, 3, 6, 8)] == [1, 1, 1, 2]
    assert hp_cap(3, 0.3, IN_BURSTS, bursty=True) == 2 and hp_cap(8, 0.5, IN_BURSTS, True) == 5
    late_in_bursts = window(rescuable=10, burstiness=60.0)
    change = decide(seats(LP, LP, LP), late_in_bursts, NOW, INF, IN_BURSTS)
    assert change is not None and change.role == HP and "bursts" in change.reason
    assert decide(seats(LP, LP, LP), window(rescuable=0, burstiness=60.0), NOW, INF,
                  IN_BURSTS) is None
    off = RoleParams(hps_in_bursts=False)  # the paper's rule: HPs for mixed SLOs only
    assert decide(seats(LP, LP, LP), late_in_bursts, NOW, INF, off) is None


def test_under_a_class_floor_bursts_may_take_half_the_instances_as_hps():
    fair = RoleParams(burst_hp_share=FAIR_BURST_HP_SHARE)
    assert [hp_cap(n, 0.0, fair, bursty=True) for n in (2, 3, 6, 8)] == [1, 2, 3, 4]
    late_in_bursts = window(rescuable=10, burstiness=60.0)
    second = decide(seats(LP, LP, HP), late_in_bursts, NOW, INF, fair)
    assert second is not None and second.role == HP and "up to 2 HP(s)" in second.reason
    assert decide(seats(LP, LP, HP), late_in_bursts, NOW, INF, IN_BURSTS) is None
    assert in_bursts(late_in_bursts, fair) and not in_bursts(window(), fair)


def test_a_quiet_spell_between_bursts_keeps_the_hp():
    calm = window(rescuable=0, burstiness=60.0)
    assert decide(seats(LP, LP, HP), calm, NOW, INF, IN_BURSTS) is None
    steady = decide(seats(LP, LP, HP), window(rescuable=0), NOW, INF, IN_BURSTS)
    assert steady is not None and steady.role == LP and "do not come in bursts" in steady.reason


def test_bursts_that_justify_fewer_hps_than_serve_send_one_back_and_say_why():
    change = decide(seats(LP, HP, HP), window(rescuable=0, burstiness=60.0), NOW, INF,
                    IN_BURSTS)
    assert change is not None and change.role == LP
    assert change.reason == "arrivals come in bursts, 0% have a tight TTFT SLO: 1 HP(s) pay"


def test_dwell_time_holds_a_role_and_a_window_must_follow_the_last_change():
    fresh = seats(LP, LP, LP, since=NOW - 5.0)
    assert decide(fresh, window(tight=60, rescuable=10), NOW, INF) is None
    settled = seats(LP, LP, LP, since=NOW - 25.0)
    assert decide(settled, window(tight=60, rescuable=10), NOW, NOW - 25.0) is not None
    assert decide(seats(LP, LP, LP), window(tight=60, rescuable=10), NOW, NOW - 5.0) is None


def test_never_zero_lps_and_one_instance_is_always_an_lp():
    assert decide(seats(LP), window(tight=200, rescuable=200), NOW, INF) is None
    assert decide(seats(LP, HP, rescued=99), window(tight=200, rescuable=200), NOW, INF) is None
    assert decide(seats(LP, HP, HP, rescued=99), window(tight=200, rescuable=200), NOW,
                  INF) is None


def test_too_little_evidence_decides_nothing():
    assert decide(seats(LP, LP, LP), window(arrivals=5, tight=5, rescuable=5), NOW, INF) is None
    assert decide(seats(LP, LP, LP), window(tight=60, rescuable=10, seconds=3.0), NOW,
                  INF) is None
