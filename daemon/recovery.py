"""What becomes of the requests an instance held when it dies. Pure: requests in, plan out.

The controller (a thin shell around this) calls `recover` for every request the dead
instance held, and `recovery_target` to pick the instance that takes it over:

* No first token yet -> **resubmit**: the same Submit (prompt tokens only, arrival and
  deadline kept) goes to another instance, marked `offloaded` as an offload is (so it
  does not count as the new request an HP's ticket asked for). Nothing was sent to the
  client, so nothing needs to match.
* Mid-decode -> **resume** by recompute: the new prompt is the original prompt followed
  by every token generated so far, `max_tokens` shrinks by that many, and the request is
  marked `preempted` -- the receiving instance treats it as a request preempted by
  recompute (never offloaded, dropped or demoted: its TTFT was met long ago). The
  client's stream and the controller's detokenizer simply go on with the next token,
  so greedy output is identical to an uninterrupted run.

  Sampling seeds: a seeded request keeps its seed, so the continuation restarts that
  seed's random stream at the resume point. A resumed *sampled* request is therefore
  reproducible (same crash point, same output) but not the same text an uninterrupted
  run would give; greedy requests (temperature 0) are exact.
* Where it is impossible -> **give up** with a message for the client: the new prompt
  would not fit the context of any instance, or (decided by the controller) no instance
  became ready within `recovery_timeout`.

Targets (`recovery_target`): where offloads go -- the ready HP instance with the fewest
requests waiting for a first token -- else the least-loaded ready instance (baseline
layouts, or no HP up); never the instance that died. An LP offload that finds no HP
ready is moved the same way (`reroute_offload`), marked preempted so that it is not
offloaded again.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

import msgspec

from ipc.messages import Submit
from policies.routing import least_loaded, route_offload

Kind = Literal["resubmit", "resume", "reroute"]


class Recovery(NamedTuple):
    """One request's fate: resubmit it (`submit` set) or end it (`error` set)."""

    kind: Kind
    submit: Submit | None = None
    error: str | None = None


def recover(submit: Submit, generated: Sequence[int], max_model_len: int) -> Recovery:
    """The plan for a request whose instance died.

    `submit` is the request as last sent, `generated` every token the controller has
    received for it (and passed on to the client), `max_model_len` the context limit of
    the instances that could take it (the smallest among them).
    """
    if not generated:
        return Recovery("resubmit", msgspec.structs.replace(submit, offloaded=True))
    resumed = resume_submit(submit, generated)
    if resumed is None:  # it had already produced everything it asked for
        return Recovery("resume", error="it had generated every token it asked for")
    if len(resumed.prompt_token_ids) >= max_model_len:
        return Recovery("resume", error=(
            f"it cannot be resumed: its prompt and output so far ({len(resumed.prompt_token_ids)} "
            f"tokens) leave no room in the context of {max_model_len} tokens"))
    return Recovery("resume", resumed)


def resume_submit(submit: Submit, generated: Sequence[int]) -> Submit | None:
    """The Submit that continues `submit` after its `generated` tokens (None if no token
    is left to generate): prompt + generated as the prompt, max_tokens reduced, marked
    preempted. Arrival, deadline, SLOs, priority and the other sampling fields stay."""
    left = submit.sampling.max_tokens - len(generated)
    if left < 1:
        return None
    sampling = msgspec.structs.replace(submit.sampling, max_tokens=left)
    return msgspec.structs.replace(
        submit, prompt_token_ids=[*submit.prompt_token_ids, *generated], sampling=sampling,
        preempted=True)


def reroute_offload(submit: Submit) -> Submit:
    """An offload no HP can take goes back to an LP; marked preempted, it stays there."""
    return msgspec.structs.replace(submit, offloaded=True, preempted=True)


def recovery_target(ready: Sequence[int], roles: Mapping[int, str], queued: Mapping[int, int],
                    in_flight: Mapping[int, int], exclude: int | None = None) -> int | None:
    """Where a recovered request goes: the ready HP with the fewest requests waiting for a
    first token (`queued`), else the ready instance with the fewest requests in flight.
    Never `exclude` (the instance that died). None when no instance is ready."""
    candidates = [i for i in ready if i != exclude]
    hp = route_offload([(i, queued.get(i, 0)) for i in candidates if roles.get(i) == "hp"])
    if hp is not None:
        return hp
    return least_loaded([(i, in_flight.get(i, 0)) for i in candidates])
