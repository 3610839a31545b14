"""The simulator's price of a P/D hand-off: the KV of the prefilled tokens crossing the
link between two GPUs (engines/executors/profiles/interconnect.py), on top of the
message's `ipc_delay`. Only a `SubmitPrefilled` carries KV; every other message costs
nothing more. The prefill instance's blocks are freed when it hands the request off (the
live daemon copies them out first), so the transfer delays the decode side only.
"""
from __future__ import annotations

import functools

from engines.executors.profiles.interconnect import get_interconnect
from engines.executors.profiles.registry import get_profile
from ipc.messages import SubmitPrefilled


@functools.lru_cache(maxsize=64)
def _link(profile_name: str, interconnect: str) -> tuple[int, object]:
    profile = get_profile(profile_name)
    return profile.kv_bytes_per_token, get_interconnect(interconnect, profile.hardware.name)


def kv_transfer_seconds(profile_name: str, interconnect: str, message) -> float:
    """Seconds `message`'s KV takes over the link; 0 for a message without KV."""
    if not isinstance(message, SubmitPrefilled):
        return 0.0
    bytes_per_token, link = _link(profile_name, interconnect)
    return link.transfer_seconds(message.num_computed_tokens * bytes_per_token)
