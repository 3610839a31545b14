"""The controller core's recovery (docs/design.md §6): the component that moves the
requests of an instance that died, or became unreachable, to another. Sans-I/O, like the
core.

Every request the lost instance held becomes MOVING (no instance holds it); each is
resubmitted (no first token yet) or resumed by recompute (mid-decode) on a ready instance
as the pure planner `daemon/core/recovery_plan.py` decides, now or as soon as one becomes
ready (`place_moving`); what no instance takes within `recovery_timeout` ends with an
error naming the instance (`give_up`, on its `RECOVERY` timer).
"""
from __future__ import annotations

import itertools

from daemon.core.controller_config import ControllerConfig
from daemon.core.events import Action, Moved, SendFailed, StartTimer, Timer
from daemon.core.ledger import Ledger
from daemon.core.recovery_plan import recover, recovery_target
from daemon.core.request_state import Outcome, RequestState, Tracked, Trigger
from ipc.api_codes import EndCode
from ipc.messages import Origin, Submit, SubmitPrefilled

#: The kind of the timers that end MOVING requests no instance took in time.
RECOVERY = "recovery"


class Recovery:
    def __init__(self, ledger: Ledger, config: ControllerConfig) -> None:
        self.ledger = ledger
        self.timeout = config.recovery_timeout
        self._timer_keys = itertools.count()

    def instance_down(self, now: float, instance_id: int, exit_code: int | None,
                      out: list[Action]) -> None:
        held = list(self.ledger.down(instance_id).held.values())
        self.lose(now, held, f"instance {instance_id} stopped (exit code {exit_code}) while "
                             "serving this request", out)

    def send_failed(self, event: SendFailed, out: list[Action]) -> None:
        message = event.message
        view = self.ledger.instances.get(event.instance_id)
        tracked = (self.ledger.held(message.request_id, view)
                   if isinstance(message, (Submit, SubmitPrefilled)) and view is not None
                   else None)
        if tracked is None:
            return  # an Abort or Shutdown to a dead instance: it holds nothing any more
        if event.unreachable:
            self.lose(event.now, [tracked], f"instance {event.instance_id} became unreachable "
                                            "while serving this request", out)
        else:
            self.ledger.end(tracked, Outcome.ERRORED, EndCode.INTERNAL,
                            "the request could not be handed to an instance", out)

    def lose(self, now: float, lost: list[Tracked], why: str, out: list[Action]) -> None:
        """Their instance is gone: each waits (MOVING) for another to take it over."""
        for tracked in lost:
            self.ledger.release(tracked)
            tracked.advance(Trigger.HOLDER_LOST)
            tracked.give_up_time, tracked.why_moving = now + self.timeout, why
        self.place_moving(out)
        if any(t.state is RequestState.MOVING for t in lost):
            timer = Timer(RECOVERY, next(self._timer_keys))
            out.append(StartTimer(timer, now + self.timeout))

    def place_moving(self, out: list[Action]) -> None:
        """Hand every MOVING request to a ready instance (`recovery_plan` plans how)."""
        ledger = self.ledger
        moving = [t for t in ledger.requests.values() if t.state is RequestState.MOVING]
        if not moving:
            return
        ready, queued, in_flight = ledger.ready_ids(), ledger.queued(), ledger.in_flight()
        for tracked in moving:
            target = recovery_target(ready, ledger.role_of, queued, in_flight)
            if target is None:
                return  # no instance is ready: they wait for a Ready or their give-up time
            plan = recover(tracked.original, tracked.token_ids,
                           ledger.instances[target].ready.max_model_len)
            if plan.error is not None:
                ledger.end(tracked, Outcome.ERRORED, EndCode.INSTANCE_FAILED,
                           f"{tracked.why_moving}: {plan.error}", out)
                continue
            in_flight[target] += 1
            queued[target] += tracked.waiting
            tracked.num_recoveries += 1
            tracked.advance(Trigger.RESUMED if plan.kind is Origin.RESUME else Trigger.RESUBMITTED)
            ledger.send_to(tracked, target, plan.submit, out)
            out.append(Moved(tracked.request_id, plan.kind, None, target))

    def give_up(self, now: float, out: list[Action]) -> None:
        """A RECOVERY timer fired: end every MOVING request past its give-up time."""
        for tracked in list(self.ledger.requests.values()):
            if tracked.state is RequestState.MOVING and tracked.give_up_time <= now:
                self.ledger.end(tracked, Outcome.ERRORED, EndCode.INSTANCE_FAILED,
                                f"{tracked.why_moving}, and no instance could take it over "
                                f"within {self.timeout:g} s; retry it", out)
