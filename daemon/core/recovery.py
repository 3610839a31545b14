"""The controller core's recovery: what it does when an instance dies (a mixin of
`ControllerCore`, which owns the state; sans-I/O like it).

Every request the dead instance held becomes MOVING (no instance holds it); each is
resubmitted (no first token yet) or resumed by recompute (mid-decode) on a ready instance
as `daemon/core/recovery_plan.py` plans, now or as soon as one becomes ready; what no instance takes
within `recovery_timeout` ends with an error naming the instance.
"""
from __future__ import annotations

from daemon.core.events import Action, Moved, SendFailed, StartTimer, Timer
from daemon.core.recovery_plan import recover, recovery_target
from daemon.core.request_state import Outcome, RequestState, Tracked, Trigger
from ipc.api_codes import EndCode
from ipc.messages import Origin, Submit, SubmitPrefilled

RECOVERY = "recovery"


class Recovery:
    def _instance_down(self, now: float, instance_id: int, exit_code: int | None,
                       out: list[Action]) -> None:
        view = self.instances[instance_id]
        view.ready = view.stats = None
        self.router.forget(instance_id)
        if self.room is not None:
            self.room.forget(instance_id)
        held = [self.requests[r] for r in view.held]
        self._lose(now, held, f"instance {instance_id} stopped (exit code {exit_code}) while "
                              "serving this request", out)

    def _send_failed(self, event: SendFailed, out: list[Action]) -> None:
        message = event.message
        view = self.instances.get(event.instance_id)
        tracked = (self._held(message.request_id, view)
                   if isinstance(message, (Submit, SubmitPrefilled)) and view is not None
                   else None)
        if tracked is None:
            return  # an Abort or Shutdown to a dead instance: it holds nothing any more
        if event.unreachable:
            self._lose(event.now, [tracked], f"instance {event.instance_id} became unreachable "
                                             "while serving this request", out)
        else:
            self._end(tracked, Outcome.ERRORED, EndCode.INTERNAL,
                      "the request could not be handed to an instance", out)

    def _lose(self, now: float, lost: list[Tracked], why: str, out: list[Action]) -> None:
        """Their instance is gone: each waits (MOVING) for another to take it over."""
        for tracked in lost:
            self._release(tracked)
            tracked.advance(Trigger.HOLDER_LOST)
            tracked.give_up_time, tracked.why_moving = now + self.config.recovery_timeout, why
        self._place_moving(out)
        if any(t.state is RequestState.MOVING for t in lost):
            timer = Timer(RECOVERY, next(self._timer_keys))
            out.append(StartTimer(timer, now + self.config.recovery_timeout))

    def _place_moving(self, out: list[Action]) -> None:
        """Hand every MOVING request to a ready instance (`daemon.core.recovery_plan` plans how)."""
        moving = [t for t in self.requests.values() if t.state is RequestState.MOVING]
        if not moving:
            return
        ready, queued, in_flight = self.ready_ids(), self.queued(), self.in_flight()
        for tracked in moving:
            target = recovery_target(ready, self.roles, queued, in_flight)
            if target is None:
                return  # no instance is ready: they wait for a Ready or their give-up time
            plan = recover(tracked.original, tracked.token_ids,
                           self.instances[target].ready.max_model_len)
            if plan.error is not None:
                self._end(tracked, Outcome.ERRORED, EndCode.INSTANCE_FAILED,
                          f"{tracked.why_moving}: {plan.error}", out)
                continue
            in_flight[target] += 1
            queued[target] += tracked.waiting
            tracked.num_recoveries += 1
            tracked.advance(Trigger.RESUMED if plan.kind is Origin.RESUME else Trigger.RESUBMITTED)
            self._send_to(tracked, target, plan.submit, out)
            out.append(Moved(tracked.request_id, plan.kind, None, target))

