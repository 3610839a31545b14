"""A GPU profile as a sim-executor latency function: engines Batch -> seconds (pure)."""
from __future__ import annotations

from engines.batch import Batch
from engines.executors.profiles.registry import get_profile


def profile_latency(name: str):
    """`fn(batch) -> seconds` predicted by the named profile. Reads the profile data now,
    so a missing data folder fails when the executor is built, not on its first batch."""
    profile = get_profile(name)
    profile.ops  # noqa: B018 -- load (and validate) the operator table eagerly

    def latency(batch: Batch) -> float:
        if not batch:
            return 0.0
        return profile.step_time(batch.shape(), num_sampling=batch.num_sampling)

    latency.__name__ = f"profile_latency_{profile.name}"
    return latency
