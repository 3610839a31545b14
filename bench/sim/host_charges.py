"""The daemon's host costs a measured profile holds (`ascendra profile`'s live phase,
engines/executors/profiles/measured.py `HostCosts`), charged by the simulator.

A step lasts its fitted executor time plus the host's cost of a step and of each of its
sequences (the instance's loop: scheduling, preparing, sending); an arrival reaches the
controller `request_s` later, less the two `ipc_delay` hops the simulator already
charges a first token (HTTP, the event loops, detokenization, the client). A built-in
profile, a format 1 file, one profiled with `--no-host`, or a stated `latency` has none:
the simulation is then exactly what it was before host costs existed.
"""
from __future__ import annotations

from engines.executors.latency import LatencyFn
from engines.executors.profiles.measured import HostCosts, MeasuredProfile


def host_costs(profile, latency_spec: str = "") -> HostCosts | None:
    """The host costs `profile` holds; None for any other (or under a stated latency)."""
    if latency_spec or not isinstance(profile, MeasuredProfile):
        return None
    return profile.host


def with_host_steps(latency: LatencyFn, host: HostCosts) -> LatencyFn:
    """`latency` plus the host's cost of each step and of each sequence in it."""
    def charged(batch) -> float:
        return latency(batch) + host.step(len(batch)) if batch else 0.0
    return charged


def arrival_delay(host: HostCosts | None, ipc_delay: float) -> float:
    """Seconds from an arrival to the controller's seeing it (0 without host costs)."""
    if host is None:
        return 0.0
    return max(0.0, host.request_s - 2 * ipc_delay)
