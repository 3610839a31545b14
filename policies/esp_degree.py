"""LoongServe's scale-up decision as pure functions: over how many instances one request's
prefill is split (elastic sequence parallelism, engines/models/sequence_parallel.py), and
which instances, in the order they are taken (`esp_members`).

A request gets an ESP group only when one instance cannot give it its first token in time
(its predicted single-instance prefill exceeds the time left before its TTFT deadline), or
when an operator has set a prompt length from which every prompt is split. The degree is
then the smallest k whose predicted ESP prefill fits the time left: every instance in the
group stops serving its own requests for the ESP step, so no more are taken than the
deadline needs. When no k that is free fits, the request takes every free instance (it is
late however it runs; this way it is least late) -- unless that is one, and it stays whole.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple


def esp_degree(num_tokens: int, time_left: float, predict: Callable[[int], float],
               free: int, max_degree: int, min_tokens: int = 0) -> int:
    """The number of instances to prefill a `num_tokens` prompt over (1: one instance, no
    group). `predict(k)`: predicted seconds of its prefill over k instances; `free`: the
    instances that could join now; `max_degree`: the operator's largest group (1: ESP
    off); `min_tokens`: split every prompt of at least this many tokens (0: only by
    prediction)."""
    most = min(free, max_degree, num_tokens)
    if most < 2:
        return 1
    forced = 0 < min_tokens <= num_tokens
    if not forced and predict(1) <= time_left:
        return 1
    for k in range(2, most + 1):
        if predict(k) <= time_left:
            return k
    return most


class EspCandidate(NamedTuple):
    """An instance that could join a group (ready, with KV room for a stripe)."""
    instance_id: int
    masters: int        # groups it is the master of: it decodes their long requests
    wait: float         # seconds of work ahead of it: its queued prefill, its groups' steps
    running: int        # requests it holds


def esp_members(candidates: Iterable[EspCandidate]) -> list[int]:
    """The instances a group takes, in order (the first k of them for degree k; the
    first is the master). A group's step stops every member's own work for its whole
    length, so the members are those it stalls least: first the instances that are no
    group's master -- a master decodes its long request right after its group's step,
    and another group's step would stall that decode for seconds, past its TBT budget --
    then the least work ahead (which would wait behind the step), then the fewest running
    requests."""
    order = sorted(candidates, key=lambda c: (c.masters, c.wait, c.running, c.instance_id))
    return [c.instance_id for c in order]
