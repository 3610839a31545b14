"""ESP groups (LoongServe's elastic sequence parallelism), the controller core's component:
which requests are prefilled over several instances, over which, and each group's life.

On arrival (`plan`) a request gets a group when one instance is predicted not to give it
its first token in time (by the prefill curve its performance model reports; an instance
without one, a baseline's, is never predicted), or its prompt is at least the operator's
`min_tokens`; its degree is `policies.esp_degree`'s (the smallest that meets the deadline
among the free instances). Free: ready, not a P/D instance, and KV room reported for a
stripe. Members are chosen (`policies.esp_degree.esp_members`) so that a group's step
stalls as little as it can, for the step stops every member's own work: first those not
a group's master (a master decodes its long request after the group's step, and another
group's step would stall that decode for its whole length: on the long-context study the
misses left were such stalls of 8-15 s, over the request's TBT budget), then those with
the least work ahead of them (the prefill queued there, which would wait behind the
step, and the pending group prefills they are in, counted as the time left of each,
`busy_seconds`), then the least loaded. The first is the master (it decodes the request
after the prefill), the next ones hold the other stripes. The protocol (ipc/messages.py):

    Submit(esp) to the master, EspJoin to the others  ->  each answers EspJoined
    all joined            ->  EspGo to every member: they run the group's prefill step
    one refused           ->  EspGo(alone) to the master (it serves the request by itself),
                              EspLeave to the others (group dissolved)
    the request ends      ->  EspLeave to the others: their stripes are freed (dissolved)
    a member stops        ->  EspLeave to the members still up; the master, if up,
                              recomputes what the others held (its scheduler preempts the
                              request by recompute: the tokens sent stay sent); a master
                              that stops takes the request into recovery as any request

Each formation and dissolution is an `EspChanged` action with its reason, for the
driver's log, metrics and records. The ledger holds the request on its master only, so
tokens, ends, recovery and the client's stream are the same as for any request.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec

from daemon.core.controller_config import EspSettings
from daemon.core.events import Action, EspChanged, Send
from daemon.core.ledger import Ledger
from daemon.core.request_state import Tracked
from engines.perf.prefill_curve import curve_seconds
from ipc.messages import EspGo, EspJoin, EspJoined, EspLeave, EspPart, Role, Submit
from policies.esp_degree import EspCandidate, esp_degree, esp_members

#: How much slower than 1/k of one instance's prefill an ESP prefill over k is predicted
#: to be: one unchunked step per stripe, and the per-layer KV all-gather
#: (engines/executors/profiles/esp_time.py: 1.09 at k = 3 and 1.15 at k = 2 for 100k
#: tokens on the A100 profile).
ESP_SLOWDOWN = 1.2
#: How much slower than its curve an instance prefills a prompt while it also serves its
#: running requests (their decodes share its steps): the curve is the prompt alone on an
#: idle instance. Chosen from the long-context study's seed-0 run (a 77k prompt took 20 s
#: on a 2L1H LP where its curve says 14.8 s); a plain estimate, not a measured model.
SHARED_SLOWDOWN = 1.3


#: Roles whose instances never join a group.
SPLIT_ROLES = (Role.PREFILL, Role.DECODE)


@dataclass
class Group:
    request_id: str
    members: list[int]                       # the master first
    reason: str
    seconds: float                           # its prefill step, predicted
    done_by: float                           # when its prefill is predicted to end
    joined: set[int] = field(default_factory=set)
    going: bool = False                      # EspGo sent


class EspGroups:
    def __init__(self, ledger: Ledger, settings: EspSettings) -> None:
        self.ledger = ledger
        self.settings = settings
        self.groups: dict[str, Group] = {}

    # ---- planning ----------------------------------------------------------------------
    def _free(self, num_tokens: int, wait: Callable[[int], float]) -> list[int]:
        """Ready instances with KV room for a stripe, in the order a group takes them
        (`policies.esp_degree.esp_members`; `wait(i)`: the work ahead of i). An instance
        may be in several pending groups: it runs their steps in the order their Go's
        came, the same on every instance, so no two wait for each other."""
        candidates = []
        for i, view in self.ledger.instances.items():
            ready = view.ready
            if ready is None or view.role in SPLIT_ROLES:
                continue   # P/D: a prompt's instances are chosen by its phase, not here
            stripe_blocks = -(-num_tokens // 2 // ready.block_size)
            if ready.num_kv_blocks - view.num_kv_blocks_used > stripe_blocks:
                masters = sum(1 for g in self.groups.values() if g.members[0] == i)
                candidates.append(EspCandidate(i, masters, wait(i), len(view.held)))
        return esp_members(candidates)

    def busy_seconds(self, instance_id: int, now: float) -> float:
        """Predicted seconds left of the pending group prefills `instance_id` is in (its
        reported backlog leaves them out: they are not in its scheduler's queue)."""
        return sum(min(g.seconds, max(0.0, g.done_by - now)) for g in self.groups.values()
                   if instance_id in g.members and self._prefilling(g))

    def _prefilling(self, group: Group) -> bool:
        tracked = self.ledger.requests.get(group.request_id)
        return tracked is not None and tracked.first_token_time is None

    def plan(self, now: float, submit: Submit, backlog: Callable[[int], float] | None = None,
             ) -> tuple[list[int], str, float, float] | None:
        """The members of a group for a new request, why, its prefill's predicted seconds
        and when that is predicted to end; None: served alone.
        `backlog(i)`: seconds of prefill queued on instance i (the waiting room's), which
        every member must get through before the group's step."""
        settings, n = self.settings, len(submit.prompt_token_ids)
        if settings.max_degree < 2 or n < 3:
            return None

        def wait(i: int) -> float:
            return (backlog(i) if backlog is not None else 0.0) + self.busy_seconds(i, now)

        free = self._free(n, wait)
        if len(free) < 2:
            return None
        curve = self.ledger.instances[free[0]].ready.prefill_curve
        forced = 0 < settings.min_tokens <= n
        if not curve and not forced:
            return None   # no performance model (sarathi, vllm): only an operator's length
        alone = prefill_seconds(curve, n)
        waits = [wait(i) for i in free]

        def predict(k: int) -> float:
            return max(waits[:k]) + (SHARED_SLOWDOWN * alone if k == 1
                                     else ESP_SLOWDOWN * alone / k)

        left = submit.deadline - now
        if not forced and SHARED_SLOWDOWN * alone <= left:
            return None   # its prefill fits alone: a queue is no reason to split it
        degree = esp_degree(n, left, predict, len(free), settings.max_degree,
                            settings.min_tokens)
        if degree < 2:
            return None
        why = (f"{n} prompt tokens >= min_tokens {settings.min_tokens}"
               if 0 < settings.min_tokens <= n else
               f"predicted {predict(1):.2f} s alone, {predict(degree):.2f} s over {degree}, "
               f"{left:.2f} s left")
        seconds = ESP_SLOWDOWN * alone / degree
        return free[:degree], why, seconds, now + max(waits[:degree]) + seconds

    def start(self, tracked: Tracked, members: list[int], reason: str, seconds: float,
              done_by: float, out: list[Action]) -> None:
        """Send the request to its master and the joins to the others; `seconds`: its
        group's predicted prefill, `done_by`: when it is predicted to end."""
        request_id, submit = tracked.request_id, tracked.submit
        self.groups[request_id] = Group(request_id, members, reason, seconds, done_by)
        self.ledger.send_to(tracked, members[0],
                            msgspec.structs.replace(submit, esp=EspPart(members, 0)), out)
        for rank, member in enumerate(members[1:], start=1):
            out.append(Send(member, EspJoin(request_id=request_id,
                                            prompt_token_ids=submit.prompt_token_ids,
                                            part=EspPart(members, rank))))

    # ---- the group's life --------------------------------------------------------------
    def joined(self, message: EspJoined, out: list[Action]) -> None:
        group = self.groups.get(message.request_id)
        if group is None or message.instance_id not in group.members or group.going:
            return
        if message.refused:
            out.append(Send(group.members[0], EspGo(request_id=group.request_id, alone=True)))
            self._dissolve(group, f"instance {message.instance_id} refused: "
                                  f"{message.refused}", group.members[1:], out)
            return
        group.joined.add(message.instance_id)
        if len(group.joined) == len(group.members):
            group.going = True
            out.append(EspChanged(group.request_id, tuple(group.members), True, group.reason))
            for member in group.members:
                out.append(Send(member, EspGo(request_id=group.request_id)))

    def settle_ended(self, out: list[Action]) -> None:
        """Dissolve the groups whose request has ended (after every event)."""
        requests = self.ledger.requests
        for group in [g for g in self.groups.values() if g.request_id not in requests]:
            self._dissolve(group, "the request ended", group.members[1:], out)

    def instance_down(self, instance_id: int, out: list[Action]) -> None:
        """A member stopped: its groups end; the members still up are told (a master up
        recomputes the request alone)."""
        for group in [g for g in self.groups.values() if instance_id in g.members]:
            up = [m for m in group.members if m != instance_id
                  and self.ledger.instances[m].ready is not None]
            self._dissolve(group, f"instance {instance_id} stopped", up, out, lost=True)

    def _dissolve(self, group: Group, reason: str, tell: list[int], out: list[Action],
                  lost: bool = False) -> None:
        del self.groups[group.request_id]
        for member in tell:
            out.append(Send(member, EspLeave(request_id=group.request_id, lost=lost)))
        if group.going:
            out.append(EspChanged(group.request_id, tuple(group.members), False, reason))


def prefill_seconds(curve: Sequence[tuple[int, float]], num_tokens: int) -> float:
    """An instance's predicted prefill of `num_tokens` from its reported curve, past the
    curve's longest prompt grown as the curve's last two points grow (attention makes a
    long prefill superlinear: on the A100 profile 32k -> 64k tokens takes 2.8x), where
    `curve_seconds` grows in proportion, which would call a 100k prompt 18 s, not 23 s."""
    if len(curve) < 2 or num_tokens <= curve[-1][0]:
        return curve_seconds(curve, num_tokens)
    (n0, s0), (n1, s1) = curve[-2], curve[-1]
    power = math.log(s1 / s0) / math.log(n1 / n0) if s1 > s0 > 0 else 1.0
    return s1 * (num_tokens / n1) ** max(power, 1.0)
