"""One instance's rules, sans-I/O: commands in, messages out; the loop's turn in three calls.

    take(commands, now, num_bad_frames)  -> outputs   each command, in order; none after
                                                      Shutdown (`stopped`: the driver exits)
    begin_step(now)                      -> (batch, outputs)   the batch to run; when there
                                                      is none, the turn ends here: what left
                                                      the queue, then (HP) a Ticket
    finish_step(batch, sampled, seconds, now) -> outputs   after a batch ran: the step's
                                                      tokens, what left the queue, then (HP)
                                                      a Ticket

An ESP group's member (engines/esp_parts.py): `begin_step` returns the group's next
prefill chunk (an `EspStep`, run with the group, then `finish_esp`) or, between two
chunks, a step of its own decodes; `waiting_step` is a step of its decodes while the
driver waits for the other members at a chunk.

A driver carries the outputs out in order, each call's before the next call: wire
messages (`ToController`) it sends; `ExportKv` and `ImportKv` (P/D layouts, an executor
with a KV cache: engines/handoff.py) it does on its executor, attaching the exported
frames to the Handoff or reporting frames it could not import (`refuse_kv`) -- before
`begin_step`, which must not schedule a request the import then refuses. Between
`begin_step` and `finish_step` it runs a non-empty batch: the instance process
(engines/instance.py) and offline generation (engines/offline.py) on their executor,
timed (engines/timed_step.py), the simulator (bench/sim/simulator.py) by advancing its
virtual clock by the batch's predicted latency. So the engine loop of docs/design.md §3
(drain the commands, handle each, schedule -> execute -> update, ask for work) is
written here once; the three drivers follow it and make no decision of their own.

It owns the engine's state: the scheduler, the KV cache's block manager and the
performance model (fed each step's measured time, refitted now and then). It reads its
executor's facts (capacity, context limit, vocabulary, whether KV travels) once and
never runs it: the core touches no device and no frame. And it owns what the controller
must hear: every Submit gets exactly one terminal answer (a finishing token, Finished,
an Offload, a Handoff from a P/D layout's prefill instance, or a RequestError), and an
HP with nothing waiting and room to spare holds one ticket (docs/design.md §5.5).
"""
from __future__ import annotations

import msgspec

from engines.batch import Batch
from engines.esp_parts import EspParts, EspStep
from engines.executors.base import Executor
from engines.handoff import (
    ExportKv, ImportKv, Prefilled, PrefilledQueue, hand_off, prefilled_request,
)
from engines.kv_cache import BlockManager
from engines.request import Request
from engines.scheduler import Scheduler
from engines.scheduler_config import SchedulerConfig
from ipc.messages import (
    Abort, CachedPrompt, EspGo, EspJoin, EspLeave, Finished, FinishReason, Heartbeat, InstanceLoad, Offload, OffloadedRequest, Origin,
    Ping, Ready,
    RequestError, Role, RoleChanged, SetRole, Shutdown, StepOutputs, Submit, SubmitPrefilled, Ticket, ToController,
    ToInstance,
)
from engines.modes import role_of_mode
from policies.admission import TICKET_BATCH_LIMIT, ticket_wanted
from engines.perf.model import PerfModel
from policies.predictor import MemoPredictor

#: Weight of the newest saturated step in the prefill rate's moving average.
RATE_WEIGHT = 0.1
#: Prompt lengths of the prefill curve an instance reports in Ready (powers of two).
CURVE_LENGTHS = tuple(2 ** k for k in range(4, 18))

#: What a driver carries out: a message to send, or KV to move on its executor.
Output = ToController | ExportKv | ImportKv


class InstanceCore:
    def __init__(self, instance_id: int, role: Role, executor: Executor,
                 config: SchedulerConfig, perf_model: PerfModel | None = None,
                 kv: BlockManager | None = None) -> None:
        """`executor`: the driver's, read for its facts only; `perf_model`: the modes that
        decide by time predict with it (and teach it each step's measured time); `kv`: a
        block manager of a shared pool (a multiplexed instance's model, engines/mux_core.py),
        else one of the executor's capacity."""
        self.instance_id = instance_id
        self.role = role
        self.vocab_size = executor.vocab_size  # prompt ids at or past it are refused
        self.carries_kv = executor.carries_kv  # a P/D hand-off moves real KV (ExportKv, ImportKv)
        self.kv = kv if kv is not None else BlockManager(
            executor.num_kv_blocks, executor.block_size, prefix_caching=config.prefix_caching)
        self.perf_model = perf_model
        self.predictor = MemoPredictor(perf_model) if perf_model is not None else None
        self.scheduler = Scheduler(config, self.kv, executor.max_model_len,
                                   executor.eos_token_ids, predictor=self.predictor)
        self.num_steps = 0
        self.num_finished = self.num_offloaded = self.num_dropped = 0
        self.ticket_open = False  # HP: a Ticket was sent and no new request has come since
        self.num_role_changes = 0  # SetRole commands that changed its role
        self.stopped = False      # Shutdown received: the driver exits
        self.num_accepted = 0     # Submits taken in (the controller counts what is in flight)
        self.prefill_rate = 0.0   # prompt tokens/s while saturated (InstanceLoad.prefill_rate)
        #: Decode instances: prefilled requests waiting for a seat and KV blocks.
        self.prefilled = PrefilledQueue()
        #: Its parts in ESP groups (engines/esp_parts.py).
        self.esp = EspParts(instance_id, self.kv, gathers=executor.carries_kv)
        #: Between a group's chunks (`begin_step`): when the last chunk began and how long
        #: it took (waiting for the other members included), and how long its own last
        #: step took (what a decode's next steps are taken to take).
        self._chunk_began = 0.0
        self._chunk_seconds = 0.0
        self._step_seconds = 0.0

    @property
    def esp_step_due(self) -> bool:
        """An ESP group's step is due here (the driver runs it with the group)."""
        return self.esp.has_step

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or bool(self.prefilled) or self.esp.has_step

    def find_request(self, request_id: str) -> Request | None:
        """The unfinished request `request_id`, None if it is not here."""
        return self.scheduler.requests.get(request_id)

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
            case EspJoin(request_id=request_id, prompt_token_ids=prompt, part=part):
                return [self.esp.join(request_id, prompt, part, None)]
            case EspGo(request_id=request_id, alone=alone):
                return self._esp_go(request_id, alone)
            case EspLeave(request_id=request_id, lost=lost):
                return self._esp_leave(request_id, lost)
            case Shutdown():
                self.stopped = True
                ids = [*self.scheduler.requests, *self.prefilled.ids(),
                       *self.esp.pending_masters()]
                outputs = [m for rid in ids for m in self._abort(rid)]
                for request_id in list(self.esp.parts):
                    self.esp.leave(request_id)
                return outputs
            case _:
                raise TypeError(f"not an instance command: {command!r}")

    def set_role(self, command: SetRole) -> RoleChanged:
        """Serve as `command.role` in `command.mode` from the next step (a `take` runs
        between steps: this is a step boundary). The waiting requests whose prefill has
        not started go back to the controller (prompt tokens only, as an offload); the
        running ones, and preempted or pinned waiting ones, stay and finish here. Only
        between LP and HP, and only with a performance model (both modes decide by
        time): else the answer names the role and mode it keeps."""
        scheduler = self.scheduler
        if (command.role is self.role and command.mode == scheduler.mode.name) or not (
                {self.role, command.role} <= {Role.LP, Role.HP} and self.predictor
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
        return self._add(submit)

    def _add(self, submit: Submit, computed: int = 0,
             blocks: list[int] | None = None) -> list[ToController]:
        """Into the scheduler; with `computed`, an ESP group's master after the group's
        step: that many prompt tokens have their KV (engines/esp_parts.py), in `blocks`
        where the group gathered it here; the master of a group still forming: its part,
        and the answer to the controller."""
        try:
            self._check_token_ids(submit.prompt_token_ids)
            if submit.esp is not None and not computed:
                answer = self.esp.join(submit.request_id, submit.prompt_token_ids, submit.esp,
                                       submit)
                if not answer.refused:
                    return [answer]
                # no room for its stripe: the master serves the request alone (the
                # controller's EspGo(alone) then finds nothing left to do)
                return [answer, *self._add(msgspec.structs.replace(submit, esp=None))]
            request = self._request(submit, pinned=submit.origin.pinned or computed > 0)
            if computed:
                if self.scheduler.add_prefilled(request, computed, blocks) and not blocks:
                    # the group's tokens' KV is spread over its instances, not in these
                    # blocks: never named in the prefix cache
                    request.num_named_blocks = computed // self.kv.block_size
            else:
                self.scheduler.add_request(request)
        except ValueError as exc:
            if blocks:  # refused: the gathered prompt's blocks go back
                holder = Request(submit.request_id, [0], submit.sampling)
                holder.block_table = blocks
                self.kv.free(holder)
            return [RequestError(instance_id=self.instance_id, request_id=submit.request_id,
                                 message=str(exc))]
        return []

    @staticmethod
    def _request(submit: Submit, pinned: bool) -> Request:
        deadline = submit.deadline
        if deadline is None:
            deadline = (submit.arrival_time + submit.ttft_slo if submit.ttft_slo is not None
                        else float("inf"))
        return Request(submit.request_id, submit.prompt_token_ids, submit.sampling,
                       arrival_time=submit.arrival_time, deadline=deadline,
                       priority=serving_class(submit), tbt_slo=submit.tbt_slo or float("inf"),
                       pinned=pinned, generated_before=submit.generated_before)

    def _esp_leave(self, request_id: str, lost: bool = False) -> list[ToController]:
        """The group ended: a holder frees its stripe; a master whose step has not run
        serves the request alone, one whose step ran recomputes what the others held
        (preempted by recompute: the tokens it sent stay sent). `lost` (a member
        stopped): a member waiting in the step for the others stops waiting."""
        if lost:
            self.esp.lose(request_id)
        if request_id in self.esp.pending_masters():
            if self.esp.lose(request_id):
                return []
            return self._esp_go(request_id, alone=True)
        if not self.esp.leave(request_id) and not self.esp.gathers:
            self.scheduler.recompute(request_id)  # a gathering master holds all its KV
        return []

    def _esp_go(self, request_id: str, alone: bool) -> list[ToController]:
        """Run the group's step (or, `alone`, serve the master's request by itself)."""
        if not alone:
            self.esp.go(request_id)
            return []
        submit = self.esp.alone(request_id)
        if submit is None:
            return []
        return self._add(msgspec.structs.replace(submit, esp=None))

    def _accept_prefilled(self, message: SubmitPrefilled) -> list[Output]:
        """A decode instance takes a request prefilled elsewhere (engines/handoff.py)."""
        self.num_accepted += 1
        submit = message.submit
        deadline = submit.deadline if submit.deadline is not None else float("inf")
        try:
            self._check_token_ids(message.token_ids)
            request = prefilled_request(message, deadline)
            self.prefilled.add(self.scheduler, Prefilled(request, message.kv))
        except ValueError as exc:
            return [RequestError(instance_id=self.instance_id, request_id=message.request_id,
                                 message=str(exc))]
        return self._admit_prefilled()

    def _admit_prefilled(self) -> list[Output]:
        return self.prefilled.admit(self.scheduler, self.carries_kv)

    def refuse_kv(self, request_id: str, why: str) -> list[Output]:
        """The driver's executor refused the frames of an `ImportKv` (they do not fit this
        cache): the request is refused, nothing of it kept, and the queue moves on."""
        self.scheduler.abort(request_id)
        return [RequestError(instance_id=self.instance_id, request_id=request_id, message=why),
                *self._admit_prefilled()]

    def _check_token_ids(self, token_ids: list[int]) -> None:
        """Refuse ids outside the model's vocabulary (none for the sim executor)."""
        vocab_size = self.vocab_size
        if vocab_size is not None and max(token_ids) >= vocab_size:
            raise ValueError(f"prompt has token id {max(token_ids)}; the vocabulary has "
                             f"{vocab_size} tokens")

    def _abort(self, request_id: str) -> list[ToController]:
        """Unknown or finished ids get nothing: their terminal answer was already sent."""
        if request_id in self.esp.pending_masters():
            self.esp.leave(request_id)
        elif self.scheduler.abort(request_id) is None and not self.prefilled.remove(request_id):
            return []
        return [Finished(instance_id=self.instance_id, request_id=request_id,
                         reason=FinishReason.ABORT)]

    # ---- the step ----------------------------------------------------------------------
    def begin_step(self, now: float) -> tuple[Batch | EspStep, list[Output]]:
        """The turn's second part: the batch to run, or the next chunk of an ESP group's
        prefill that is due (the driver runs it with the group, then calls `finish_esp`)
        -- or, between two chunks, a step of this instance's own running decodes, when
        one of them could not wait another chunk and still meet its mean TBT
        (`_decodes_first`). An empty batch (no
        work, or the scheduler only took requests out of the queue) ends the turn here,
        with what `finish_step` would say of it: the driver runs nothing and goes back to
        draining."""
        if self.esp.has_step:
            if self._decodes_first(now):
                batch = self.scheduler.schedule_decodes()
                if batch:
                    return batch, []
            self._chunk_began = now
            return self.esp.next_step(self.scheduler.token_budget), []
        batch = self._schedule(now) if self.has_work else Batch()
        if batch:
            return batch, []
        return batch, self.finish_step(batch, [], 0.0, now)

    def waiting_step(self, now: float) -> Batch:
        """A step of its own running decodes while it waits for the other members of its
        group to reach the group's next chunk (the driver knows they are not all there;
        empty: nothing to decode, it waits idle). Whatever it decodes meanwhile costs the
        group nothing but the step's end: the others are not there yet."""
        if not self.esp.has_step:
            return Batch()
        return self.scheduler.schedule_decodes()

    def _decodes_first(self, now: float) -> bool:
        """Whether a step of the running decodes goes before the group's next chunk: a
        request a group prefilled here waits for its first token, or some decode with a
        TBT target could not wait one more chunk (as long as the last one) and still
        give its remaining tokens, at one step each (as long as its last step), by
        the time its mean TBT allows for its last one (first token + target x tokens
        after it; its remaining tokens: up to its max_tokens). Such a decode then gets
        every step until it ends: its slack no longer covers a chunk, and a step of it
        leaves the slack as it was. Decodes with slack wait: the group goes first.
        (Exact where a request generates its max_tokens, as the simulator's do; one that
        stops early at an end-of-sequence token had less slack than this counts.)"""
        chunk, step = self._chunk_seconds, self._step_seconds
        for request in self.scheduler.running:
            first = request.first_token_time
            if first is None:
                if request.num_uncomputed_tokens == 1 and request.pinned:
                    return True     # a group's prompt: its first token
                continue
            left = request.max_total_tokens - request.num_tokens
            last = first + request.tbt_slo * (request.num_output_tokens - 1 + left)
            if last - now - left * step < chunk:
                return True
        return False

    def _schedule(self, now: float) -> Batch:
        batch = self.scheduler.schedule(now)
        if not batch and self.scheduler.has_work and not batch.has_events:
            raise RuntimeError(f"scheduler made no progress with {len(self.scheduler.waiting)} "
                               f"waiting and {len(self.scheduler.running)} running requests")
        return batch

    def finish_step(self, batch: Batch, sampled: list[int], seconds: float, now: float,
                    learn: bool = True) -> list[Output]:
        """The turn's last part, after `batch` ran for `seconds` (`begin_step` calls it for
        an empty one): the step's tokens (one message), what left the queue (hand-offs,
        offloads, drops), then an HP's ask for work. `learn` False: `seconds` are not the
        batch's own (a multiplexed step's other models ran in them too), so the
        performance model is not taught them."""
        messages: list[Output] = []
        tokens = None
        if batch:
            self._step_seconds = seconds
            tokens = self.scheduler.update(batch, sampled, now)
            if learn:
                self._learn(batch, seconds)
            self.num_steps += 1
            queued = self.scheduler.queued_prefill()
            if not self.esp.has_step:
                # a step between a group's chunks says nothing of how fast it prefills
                # its queue: the group, not its speed, keeps its prompts waiting
                self._measure_prefill(batch, seconds, queued[0])
            load = self.load(queued)
            self.num_finished += len(tokens.finished)
            messages.append(StepOutputs(instance_id=self.instance_id, step=self.num_steps,
                                        time=now, step_seconds=seconds, tokens=tokens,
                                        load=load, cached=_cached_prompts(batch),
                                        admitted=_first_admitted(batch)))
        if self.prefilled:  # the step may have freed a seat or blocks
            messages += self._admit_prefilled()
        if self.role is Role.PREFILL and tokens:
            messages += hand_off(self.scheduler, tokens, self.instance_id, self.carries_kv)
        if batch.offloaded:
            self.num_offloaded += len(batch.offloaded)
            messages.append(Offload(instance_id=self.instance_id, requests=[
                OffloadedRequest(r.request_id, r.prompt_token_ids) for r in batch.offloaded]))
        for request in batch.dropped:
            self.num_dropped += 1
            messages.append(Finished(instance_id=self.instance_id, request_id=request.request_id,
                                     reason=FinishReason.DROP))
        messages += self.ask_for_work()
        return messages

    def finish_esp(self, step: EspStep, now: float, failed: bool = False) -> list[Output]:
        """After a chunk of the group's prefill; after its last one the master takes the
        request into its scheduler, every prompt token but the last computed (its next
        step computes that one and samples the first token); a holder keeps its stripe. `failed`: the step
        did not complete (a member died inside it): the master recomputes the prompt
        alone, a holder frees its part."""
        submit, computed, blocks = self.esp.stepped(step, failed)
        self.num_steps += 1
        self._chunk_seconds = now - self._chunk_began
        outputs: list[Output] = []
        if submit is not None:
            outputs += self._add(msgspec.structs.replace(submit, esp=None) if not computed
                                 else submit, computed=computed, blocks=blocks)
        return outputs + self.ask_for_work()

    def _learn(self, batch: Batch, seconds: float) -> None:
        """Feed the performance model; refit it now and then (and forget stale predictions)."""
        if self.perf_model is None:
            return
        self.perf_model.observe(batch.shape(), seconds)
        if self.perf_model.should_refit():
            self.perf_model.refit()
            self.predictor.clear()

    def ask_for_work(self) -> list[ToController]:
        """HP, between steps: with nothing waiting and room in batch and KV, hold one ticket."""
        if self.role is not Role.HP:
            return []
        scheduler, kv = self.scheduler, self.kv
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
        tokens, seconds = queued or self.scheduler.queued_prefill()
        kv, scheduler = self.kv, self.scheduler
        return InstanceLoad(self.num_accepted, tokens, seconds, len(scheduler.running),
                            self.prefill_rate, kv.num_blocks - kv.num_free_blocks,
                            scheduler.queued_sheddable_tokens())

    def ready(self, pid: int, executor_kind: str) -> Ready:
        scheduler, kv = self.scheduler, self.kv
        return Ready(instance_id=self.instance_id, role=self.role, mode=scheduler.mode.name,
                     executor=executor_kind, pid=pid, num_kv_blocks=kv.num_blocks,
                     block_size=kv.block_size, max_model_len=scheduler.max_model_len,
                     prefill_curve=self._prefill_curve(), token_budget=scheduler.token_budget,
                     prefix_caching=kv.prefix_caching)

    def _prefill_curve(self) -> list[tuple[int, float]]:
        """Its model's predicted prefill seconds at a few prompt lengths up to its context."""
        predictor, scheduler = self.predictor, self.scheduler
        if predictor is None:
            return []
        lengths = [n for n in CURVE_LENGTHS if n < scheduler.max_model_len]
        return [(n, predictor.prefill_time(n, 0, scheduler.token_budget)) for n in lengths]

    def heartbeat(self, now: float, num_bad_frames: int = 0, ping_id: int | None = None,
                  ) -> Heartbeat:
        """`num_bad_frames`: the driver's count of frames it could not decode."""
        scheduler, kv, perf = self.scheduler, self.kv, self.perf_model
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
