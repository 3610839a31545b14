"""How many examples a property check tries: its full count in the whole suite (what CI
runs), a fifth of it in the fast lane (`-m "not slow"`; conftest.py says which lane runs)."""
from __future__ import annotations

FAST_LANE_SHARE = 0.2

#: Set by conftest.py's `pytest_configure`, before any test module is imported.
fast_lane = False


def examples(full: int) -> int:
    """`full` examples, or the fast lane's share of them (at least ten)."""
    return max(10, round(full * FAST_LANE_SHARE)) if fast_lane else full
