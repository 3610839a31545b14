"""Recovery plans: what becomes of the requests an instance held when it dies. Pure
functions: requests in, plans out.

The core's recovery component (daemon/core/recovery.py) calls `recover` for every request
the dead instance held, and `recovery_target` to pick the instance that takes it over:

* No first token yet -> **resubmit**: the request as first sent (prompt tokens only,
  arrival and deadline kept) goes to another instance with origin RESUBMIT (not NEW,
  so it does not use the new request an HP's ticket asked for). Nothing was sent to the
  client, so nothing needs to match.
* Mid-decode -> **resume** by recompute: the new prompt is the original prompt followed
  by every token generated so far, `max_tokens` shrinks by that many, and the origin is
  RESUME -- pinned: the receiving instance treats it as started (never offloaded,
  dropped or demoted: its TTFT was met long ago). The client's stream and the
  controller's detokenizer simply go on with the next token, so greedy output is
  identical to an uninterrupted run. A request resumed twice is rebuilt from its
  original Submit each time, so no token is repeated.

  Sampling seeds: a seeded request keeps its seed, so the continuation restarts that
  seed's random stream at the resume point. A resumed *sampled* request is therefore
  reproducible (same crash point, same output) but not the same text an uninterrupted
  run would give; greedy requests (temperature 0) are exact.
* Where it is impossible -> **give up** with a message for the client: the new prompt
  would not fit the context of any instance, or (decided by the recovery component) no
  instance became ready within `recovery_timeout`.

Targets (`recovery_target`): where offloads go -- the ready HP instance with the fewest
requests waiting for a first token -- else the least-loaded ready instance (baseline
layouts, or no HP up). An LP offload that finds no HP ready is moved the same way
(`reroute_offload`), pinned so that it is not offloaded again.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import msgspec

from ipc.messages import Origin, Role, Submit
from policies.routing import least_loaded, route_offload


class RecoveryPlan(NamedTuple):
    """One request's fate: resubmit or resume it (`submit` set) or end it (`error` set)."""

    kind: Origin
    submit: Submit | None = None
    error: str | None = None


def recover(original: Submit, generated: Sequence[int], max_model_len: int) -> RecoveryPlan:
    """The plan for a request whose instance died.

    `original` is the request as first sent, `generated` every token the controller has
    received for it (and passed on to the client), `max_model_len` the context limit of
    the instance that would take it.
    """
    if not generated:
        resubmitted = msgspec.structs.replace(original, origin=Origin.RESUBMIT)
        return RecoveryPlan(Origin.RESUBMIT, resubmitted)
    resumed = resume_submit(original, generated)
    if resumed is None:  # it had already produced everything it asked for
        return RecoveryPlan(Origin.RESUME, error="it had generated every token it asked for")
    if len(resumed.prompt_token_ids) >= max_model_len:
        return RecoveryPlan(Origin.RESUME, error=(
            f"it cannot be resumed: its prompt and output so far ({len(resumed.prompt_token_ids)} "
            f"tokens) leave no room in the context of {max_model_len} tokens"))
    return RecoveryPlan(Origin.RESUME, resumed)


def resume_submit(original: Submit, generated: Sequence[int]) -> Submit | None:
    """The Submit that continues `original` after its `generated` tokens (None if no token
    is left to generate): prompt + generated as the prompt, max_tokens reduced, origin
    RESUME. Arrival, deadline, SLOs, priority and the other sampling fields stay."""
    left = original.sampling.max_tokens - len(generated)
    if left < 1:
        return None
    sampling = msgspec.structs.replace(original.sampling, max_tokens=left)
    return msgspec.structs.replace(
        original, prompt_token_ids=[*original.prompt_token_ids, *generated], sampling=sampling,
        origin=Origin.RESUME, generated_before=len(generated))


def reroute_offload(submit: Submit) -> Submit:
    """An offload no HP can take goes back to an LP; pinned (REROUTE), it stays there."""
    return msgspec.structs.replace(submit, origin=Origin.REROUTE)


def recovery_target(ready: Sequence[int], roles: Mapping[int, Role], queued: Mapping[int, int],
                    in_flight: Mapping[int, int]) -> int | None:
    """Where a moved request goes: the ready HP with the fewest requests waiting for a
    first token (`queued`), else the ready instance with the fewest requests in flight.
    None when no instance is ready (the one that died is not, until it has restarted)."""
    hp = route_offload([(i, queued.get(i, 0)) for i in ready if roles.get(i) is Role.HP])
    if hp is not None:
        return hp
    return least_loaded([(i, in_flight.get(i, 0)) for i in ready])
