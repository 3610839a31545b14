"""One instance's rules, sans-I/O: commands in, messages out; the loop's turn in three calls.

    take(commands, now, num_bad_frames)  -> outputs   each command, in order; none after
                                                      Shutdown (`stopped`: the driver exits)
    begin_step(now)                      -> batch     empty: nothing to run this turn
    finish_step(batch, sampled, seconds, now) -> outputs   the step's tokens, what left the
                                                      queue, then (HP) a Ticket

A driver carries the outputs out in order, each call's before the next call: wire
messages (`ToController`) it sends; `ExportKv` and `ImportKv` (P/D layouts, an executor
with a KV cache: engines/handoff.py) it does on its executor, attaching the exported
frames to the Handoff or reporting frames it could not import (`refuse_kv`). Between
`begin_step` and `finish_step` it runs the batch -- the instance process on its executor,
timing it, the simulator by advancing its virtual clock by the batch's predicted latency
-- and for an empty batch calls `finish_step` at once (offloads and drops may have left
the queue; an idle HP asks for work). So the engine loop of docs/design.md §3 (drain the
commands, handle each, step if there is work, ask for work) is written here once; the
instance process (`engines/instance.py`) and the simulator (`bench/sim/simulator.py`)
follow it and make no decision of their own. The core touches no device and no frame.

It owns the engine and what the controller must hear about it: every Submit gets
exactly one terminal answer (a finishing token, Finished, an Offload, a Handoff
from a P/D layout's prefill instance, or a RequestError), and an HP with nothing waiting
and room to spare holds one ticket (docs/design.md §5.5).
"""
from __future__ import annotations

from engines.batch import Batch
from engines.engine import Engine
from engines.handoff import (
    ExportKv, ImportKv, Prefilled, PrefilledQueue, hand_off, prefilled_request,
)
from ipc.messages import (
    Abort, CachedPrompt, Finished, FinishReason, Heartbeat, InstanceLoad, Offload, OffloadedRequest, Origin,
    Ping, Ready,
    RequestError, Role, RoleChanged, SetRole, Shutdown, StepOutputs, Submit, SubmitPrefilled, Ticket, ToController,
    ToInstance,
)
from engines.modes import role_of_mode
from policies.admission import TICKET_BATCH_LIMIT, ticket_wanted

#: Weight of the newest saturated step in the prefill rate's moving average.
RATE_WEIGHT = 0.1
#: Prompt lengths of the prefill curve an instance reports in Ready (powers of two).
CURVE_LENGTHS = tuple(2 ** k for k in range(4, 18))

#: What a driver carries out: a message to send, or KV to move on its executor.
Output = ToController | ExportKv | ImportKv


class InstanceCore:
    def __init__(self, instance_id: int, role: Role, engine: Engine) -> None:
        self.instance_id = instance_id
        self.role = role
        self.engine = engine
        self.num_steps = 0
        self.num_finished = self.num_offloaded = self.num_dropped = 0
        self.ticket_open = False  # HP: a Ticket was sent and no new request has come since
        self.num_role_changes = 0  # SetRole commands that changed its role
        self.stopped = False      # Shutdown received: the driver exits
        self.num_accepted = 0     # Submits taken in (the controller counts what is in flight)
        self.prefill_rate = 0.0   # prompt tokens/s while saturated (InstanceLoad.prefill_rate)
        #: Decode instances: prefilled requests waiting for a seat and KV blocks.
        self.prefilled = PrefilledQueue()

    @property
    def has_work(self) -> bool:
        return self.engine.has_work or bool(self.prefilled)

    # ---- commands ----------------------------------------------------------------------
    def take(self, commands: list[ToInstance], now: float, num_bad_frames: int = 0,
             ) -> list[Output]:
        """The turn's first part: each command the driver drained, in order, until a
        Shutdown; `num_bad_frames`: the driver's count of frames it could not decode (a
        Ping's Heartbeat reports it)."""
        outputs: list[Output] = []
        for command in commands:
            outputs += self.handle(command, now, num_bad_frames)
            if self.stopped:
                break
        return outputs

    def handle(self, command: ToInstance, now: float, num_bad_frames: int = 0,
               ) -> list[Output]:
        match command:
            case Submit():
                return self._accept(command)
            case SubmitPrefilled():
                return self._accept_prefilled(command)
            case Abort(request_id=request_id):
                return self._abort(request_id)
            case Ping(ping_id=ping_id):
                return [self.heartbeat(now, num_bad_frames, ping_id=ping_id)]
            case SetRole():
                return [self.set_role(command)]
            case Shutdown():
                self.stopped = True
                ids = [*self.engine.scheduler.requests, *self.prefilled.ids()]
                return [m for rid in ids for m in self._abort(rid)]
            case _:
                raise TypeError(f"not an instance command: {command!r}")

    def set_role(self, command: SetRole) -> RoleChanged:
        """Serve as `command.role` in `command.mode` from the next step (a `take` runs
        between steps: this is a step boundary). The waiting requests whose prefill has
        not started go back to the controller (prompt tokens only, as an offload); the
        running ones, and preempted or pinned waiting ones, stay and finish here. Only
        between LP and HP, and only with a performance model (both modes decide by
        time): else the answer names the role and mode it keeps."""
        scheduler = self.engine.scheduler
        if (command.role is self.role and command.mode == scheduler.mode.name) or not (
                {self.role, command.role} <= {Role.LP, Role.HP} and self.engine.predictor
                and role_of_mode(command.mode) is command.role):
            return RoleChanged(instance_id=self.instance_id, role=self.role,
                               mode=scheduler.mode.name)
        returned = scheduler.give_back_waiting()
        scheduler.set_mode(command.mode)
        self.role, self.ticket_open = command.role, False
        self.num_role_changes += 1
        return RoleChanged(instance_id=self.instance_id, role=self.role, mode=command.mode,
                           returned=[OffloadedRequest(r.request_id, r.prompt_token_ids)
                                     for r in returned], load=self.load())

    def _accept(self, submit: Submit) -> list[ToController]:
        self.num_accepted += 1
        if submit.origin is Origin.NEW:
            self.ticket_open = False  # a new request came: it used our ticket (or beat it)
        deadline = submit.deadline
        if deadline is None:
            deadline = (submit.arrival_time + submit.ttft_slo if submit.ttft_slo is not None
                        else float("inf"))
        try:
            self._check_token_ids(submit.prompt_token_ids)
            self.engine.add_request(
                submit.prompt_token_ids, submit.sampling, request_id=submit.request_id,
                arrival_time=submit.arrival_time, deadline=deadline, priority=serving_class(submit),
                tbt_slo=submit.tbt_slo or float("inf"), pinned=submit.origin.pinned,
                generated_before=submit.generated_before)
        except ValueError as exc:
            return [RequestError(instance_id=self.instance_id, request_id=submit.request_id,
                                 message=str(exc))]
        return []

    def _accept_prefilled(self, message: SubmitPrefilled) -> list[Output]:
        """A decode instance takes a request prefilled elsewhere (engines/handoff.py)."""
        self.num_accepted += 1
        submit = message.submit
        deadline = submit.deadline if submit.deadline is not None else float("inf")
        try:
            self._check_token_ids(message.token_ids)
            request = prefilled_request(message, deadline)
            self.prefilled.add(self.engine, Prefilled(request, message.kv))
        except ValueError as exc:
            return [RequestError(instance_id=self.instance_id, request_id=message.request_id,
                                 message=str(exc))]
        return self._admit_prefilled()

    def _admit_prefilled(self) -> list[Output]:
        return self.prefilled.admit(self.engine)

    def refuse_kv(self, request_id: str, why: str) -> list[Output]:
        """The driver's executor refused the frames of an `ImportKv` (they do not fit this
        cache): the request is refused, nothing of it kept, and the queue moves on."""
        self.engine.abort(request_id)
        return [RequestError(instance_id=self.instance_id, request_id=request_id, message=why),
                *self._admit_prefilled()]

    def _check_token_ids(self, token_ids: list[int]) -> None:
        """Refuse ids outside the model's vocabulary (none for the sim executor)."""
        vocab_size = self.engine.executor.vocab_size
        if vocab_size is not None and max(token_ids) >= vocab_size:
            raise ValueError(f"prompt has token id {max(token_ids)}; the vocabulary has "
                             f"{vocab_size} tokens")

    def _abort(self, request_id: str) -> list[ToController]:
        """Unknown or finished ids get nothing: their terminal answer was already sent."""
        if not self.engine.abort(request_id) and not self.prefilled.remove(request_id):
            return []
        return [Finished(instance_id=self.instance_id, request_id=request_id,
                         reason=FinishReason.ABORT)]

    # ---- the step ----------------------------------------------------------------------
    def begin_step(self, now: float) -> Batch:
        """The turn's second part: the batch to run; empty when there is no work (or the
        scheduler only took requests out of the queue)."""
        if not self.has_work:
            return Batch()
        return self.engine.begin_step(now)

    def finish_step(self, batch: Batch, sampled: list[int], seconds: float, now: float,
                    ) -> list[Output]:
        """The turn's last part, after `batch` ran for `seconds` (at once for an empty one):
        the step's tokens (one message), what left the queue (hand-offs, offloads, drops),
        then an HP's ask for work."""
        result = self.engine.finish_step(batch, sampled, seconds, now)
        messages: list[Output] = []
        if batch:
            self.num_steps += 1
            queued = self.engine.scheduler.queued_prefill()
            self._measure_prefill(batch, seconds, queued[0])
            load = self.load(queued)
            self.num_finished += len(result.tokens.finished)
            messages.append(StepOutputs(instance_id=self.instance_id, step=self.num_steps,
                                        time=now, step_seconds=seconds, tokens=result.tokens,
                                        load=load, cached=_cached_prompts(batch),
                                        admitted=_first_admitted(batch)))
        if self.prefilled:  # the step may have freed a seat or blocks
            messages += self._admit_prefilled()
        if self.role is Role.PREFILL and result.tokens:
            messages += hand_off(self.engine, result.tokens, self.instance_id)
        if result.offloaded:
            self.num_offloaded += len(result.offloaded)
            messages.append(Offload(instance_id=self.instance_id, requests=[
                OffloadedRequest(r.request_id, r.prompt_token_ids) for r in result.offloaded]))
        for request in result.dropped:
            self.num_dropped += 1
            messages.append(Finished(instance_id=self.instance_id, request_id=request.request_id,
                                     reason=FinishReason.DROP))
        messages += self.ask_for_work()
        return messages

    def ask_for_work(self) -> list[ToController]:
        """HP, between steps: with nothing waiting and room in batch and KV, hold one ticket."""
        if self.role is not Role.HP:
            return []
        scheduler, kv = self.engine.scheduler, self.engine.kv
        if not ticket_wanted(len(scheduler.waiting), len(scheduler.running), TICKET_BATCH_LIMIT,
                             kv.num_free_blocks / kv.num_blocks, self.ticket_open):
            return []
        self.ticket_open = True
        return [Ticket(instance_id=self.instance_id)]

    def _measure_prefill(self, batch: Batch, seconds: float, still_queued: int) -> None:
        """Update the prefill rate from a step that left prompt tokens waiting (a step that
        ran out of them says nothing of how fast they go; one that ran none while they
        waited -- no KV or seat free -- says they go slowly)."""
        if seconds > 0 and still_queued:
            rate = sum(c.num_tokens for c in batch.added if not c.is_decode) / seconds
            self.prefill_rate = rate if not self.prefill_rate else (
                (1 - RATE_WEIGHT) * self.prefill_rate + RATE_WEIGHT * rate)

    # ---- reports -----------------------------------------------------------------------
    def load(self, queued: tuple[int, float] | None = None) -> InstanceLoad:
        """Its load now; `queued`: `Scheduler.queued_prefill()` if already at hand."""
        tokens, seconds = queued or self.engine.scheduler.queued_prefill()
        kv = self.engine.kv
        scheduler = self.engine.scheduler
        return InstanceLoad(self.num_accepted, tokens, seconds, len(scheduler.running),
                            self.prefill_rate, kv.num_blocks - kv.num_free_blocks,
                            scheduler.queued_sheddable_tokens())

    def ready(self, pid: int, executor_kind: str) -> Ready:
        scheduler = self.engine.scheduler
        return Ready(instance_id=self.instance_id, role=self.role, mode=scheduler.mode.name,
                     executor=executor_kind, pid=pid, num_kv_blocks=self.engine.kv.num_blocks,
                     block_size=self.engine.kv.block_size, max_model_len=scheduler.max_model_len,
                     prefill_curve=self._prefill_curve(), token_budget=scheduler.token_budget,
                     prefix_caching=self.engine.kv.prefix_caching)

    def _prefill_curve(self) -> list[tuple[int, float]]:
        """Its model's predicted prefill seconds at a few prompt lengths up to its context."""
        predictor, scheduler = self.engine.predictor, self.engine.scheduler
        if predictor is None:
            return []
        lengths = [n for n in CURVE_LENGTHS if n < scheduler.max_model_len]
        return [(n, predictor.prefill_time(n, 0, scheduler.token_budget)) for n in lengths]

    def heartbeat(self, now: float, num_bad_frames: int = 0, ping_id: int | None = None,
                  ) -> Heartbeat:
        """`num_bad_frames`: the driver's count of frames it could not decode."""
        scheduler, kv = self.engine.scheduler, self.engine.kv
        perf = self.engine.perf_model
        return Heartbeat(
            instance_id=self.instance_id, time=now, ping_id=ping_id,
            num_waiting=len(scheduler.waiting), num_running=len(scheduler.running),
            num_kv_blocks_used=kv.num_blocks - kv.num_free_blocks, num_kv_blocks=kv.num_blocks,
            num_preemptions=scheduler.num_preemptions, num_steps=self.num_steps,
            num_bad_frames=num_bad_frames, num_finished=self.num_finished,
            num_offloaded=self.num_offloaded, num_dropped=self.num_dropped,
            perf_model_mape=perf.mape if perf else None,
            prefix_queried_blocks=kv.stats.queried_blocks, prefix_hit_blocks=kv.stats.hit_blocks,
            prefix_queried_tokens=kv.stats.queried_tokens, prefix_hit_tokens=kv.stats.hit_tokens)


def _first_admitted(batch: Batch) -> list[str]:
    """The requests whose prefill started this step (not a preempted one's restart)."""
    return [r.request_id for r in batch.admitted if r.num_preemptions == 0]


def _cached_prompts(batch: Batch) -> list[CachedPrompt]:
    """The prefix-cache hits of the requests this step admitted for the first time."""
    return [CachedPrompt(r.request_id, r.num_cached_tokens) for r in batch.admitted
            if r.num_preemptions == 0 and r.num_cached_tokens]


def serving_class(submit: Submit) -> int:
    """The class the scheduler serves first (higher first): the request's priority band,
    and within it a favoured request (its tenant under its fair share) first."""
    return 2 * submit.priority + submit.favoured
