"""A multiplexed instance's rules, sans-I/O: several models on one device (MuxServe).

The same turn as `InstanceCore` (engines/instance_core.py) -- `take`, `begin_step`,
`finish_step` -- so its three drivers (the instance process, offline generation, the
simulator) run it unchanged. Inside, each model is a *part*: an `InstanceCore` of its own
(its scheduler, its requests, its performance model) whose `BlockManager` draws on one
`KvPool` shared by every model (engines/kv_pool.py: head-wise units, so models of
different shapes share it). So chunked prefill, the decode reserve, preemption (of the
model's own requests), prefix caching (within a model) and the LP/HP modes work per model
as they do on a dedicated instance.

A step runs the models' parts in turn (temporal multiplexing): `begin_step` asks each
part's scheduler for its batch with its share of the step's token budget
(policies/mux_share.py: by popularity over TBT target, water-filled by demand), the
driver runs the `MuxBatch` (engines/executors/mux_executor.py: each model's part on its
own executor, one after the other), and `finish_step` hands each part its tokens. The
parts take turns going first, so no model always finds the pool emptier than the others.
What the controller hears is one instance: one StepOutputs a step (the parts' tokens
merged), one Heartbeat, one Ready naming its models, at most one Ticket.

A Submit names its model (`Submit.model`; "" = the first); one for a model the instance
does not hold is refused (RequestError naming it). P/D roles are not multiplexed.
"""
from __future__ import annotations

from dataclasses import dataclass

from engines.batch import Batch
from engines.executors.base import Executor
from engines.instance_core import InstanceCore, Output
from engines.kv_cache import BlockManager
from engines.kv_pool import KvPool
from engines.perf.model import PerfModel
from engines.scheduler_config import SchedulerConfig
from ipc.messages import (
    Abort, Heartbeat, InstanceLoad, Origin, Ping, Ready, RequestError, Role, RoleChanged, SetRole,
    Shutdown, StepOutputs, StepTokens, Submit, SubmitPrefilled, Ticket, ToInstance,
)
from policies.admission import TICKET_BATCH_LIMIT, ticket_wanted
from policies.batch_shape import BatchShape
from policies.mux_share import PRIOR_ARRIVALS, decayed, model_weight, split_budget


@dataclass
class MuxModel:
    """One model of a multiplexed instance: its served name, its executor (read for its
    facts), its block's cost in pool units, and its performance model (None: none)."""

    name: str
    executor: Executor
    block_units: int
    perf_model: PerfModel | None = None


class MuxBatch:
    """One multiplexed step: each model's batch, in the order they run."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[tuple[str, Batch]]) -> None:
        self.parts = parts

    def __bool__(self) -> bool:
        return any(batch for _, batch in self.parts)

    @property
    def added(self) -> list:
        """Every part's non-decode-column chunks (what a simulator reads a prefill off)."""
        return [chunk for _, batch in self.parts for chunk in batch.added]

    def shape(self) -> BatchShape:
        """The step's batch shape: every model's prefill chunks and decodes together."""
        shapes = [batch.shape() for _, batch in self.parts if batch]
        return BatchShape.of([p for s in shapes for p in s.prefills],
                             [d for s in shapes for d in s.decodes])


class MuxCore:
    def __init__(self, instance_id: int, role: Role, models: list[MuxModel],
                 config: SchedulerConfig, pool: KvPool) -> None:
        if role in (Role.PREFILL, Role.DECODE):
            raise ValueError(f"a multiplexed instance cannot take the {role.value} role "
                             "(P/D layouts hand KV between instances of one model)")
        names = [m.name for m in models]
        if not models or len(set(names)) != len(names):
            raise ValueError(f"a multiplexed instance needs distinct model names, got {names}")
        self.instance_id, self.role, self.pool = instance_id, role, pool
        self.names = names
        self.parts: dict[str, InstanceCore] = {}
        for model in models:
            executor = model.executor
            kv = BlockManager(max(1, pool.num_units // model.block_units), executor.block_size,
                              prefix_caching=config.prefix_caching, pool=pool,
                              model=model.name, block_units=model.block_units)
            self.parts[model.name] = InstanceCore(instance_id, role, executor, config,
                                                  model.perf_model, kv=kv)
        self.token_budget = config.chunk_size
        self.stopped = False
        self.ticket_open = False
        self.num_steps = 0
        #: Each model's decayed arrival count and when it was last decayed; its TBT target.
        self._arrivals: dict[str, tuple[float, float | None]] = {
            name: (PRIOR_ARRIVALS, None) for name in names}  # None: no time seen yet
        self._tbt_slo = {name: float("inf") for name in names}
        self._first = 0  # which part goes first this step (they take turns)

    @property
    def esp_step_due(self) -> bool:
        """Never: a multiplexed instance joins no ESP group (a config error, daemon/config.py)."""
        return False

    @property
    def has_work(self) -> bool:
        return any(part.has_work for part in self.parts.values())

    @property
    def prefilled(self) -> dict:
        """No P/D hand-offs here (the instance process reads what waits for its KV)."""
        return {}

    def part_of(self, request_id: str) -> InstanceCore | None:
        """The part holding `request_id`, None if none does."""
        return next((p for p in self.parts.values() if request_id in p.scheduler.requests),
                    None)

    def find_request(self, request_id: str):
        """The unfinished request `request_id` (engines/request.py), None if not here."""
        part = self.part_of(request_id)
        return part.find_request(request_id) if part is not None else None

    # ---- commands ----------------------------------------------------------------------
    #: The turn's first part, InstanceCore's own: each command through `self.handle`, in
    #: order, until a Shutdown (it reads only `handle` and `stopped`, which this core has).
    take = InstanceCore.take

    def handle(self, command: ToInstance, now: float, num_bad_frames: int = 0,
               ) -> list[Output]:
        match command:
            case Submit():
                return self._accept(command, now)
            case Abort(request_id=request_id):
                part = self.part_of(request_id)
                return part.handle(command, now) if part is not None else []
            case Ping(ping_id=ping_id):
                return [self.heartbeat(now, num_bad_frames, ping_id=ping_id)]
            case SetRole():
                return [self.set_role(command)]
            case Shutdown():
                self.stopped = True
                return [m for part in self.parts.values() for m in part.handle(command, now)]
            case SubmitPrefilled():
                return [RequestError(instance_id=self.instance_id, request_id=command.request_id,
                                     message="a multiplexed instance takes no prefilled request")]
            case _:
                raise TypeError(f"not an instance command: {command!r}")

    def _accept(self, submit: Submit, now: float) -> list[Output]:
        name = submit.model or self.names[0]
        part = self.parts.get(name)
        if part is None:
            return [RequestError(instance_id=self.instance_id, request_id=submit.request_id,
                                 message=f"model {submit.model!r} is not served by this "
                                         f"instance (it holds {', '.join(self.names)})")]
        count, since = self._arrivals[name]
        self._arrivals[name] = (decayed(count, now - (now if since is None else since)) + 1.0,
                                now)
        if submit.tbt_slo is not None:
            self._tbt_slo[name] = min(self._tbt_slo[name], submit.tbt_slo)
        if submit.origin is Origin.NEW:
            self.ticket_open = False
        return part.handle(submit, now)

    def set_role(self, command: SetRole) -> RoleChanged:
        """Every model's part changes (or keeps) its role together; what they give back
        goes back as one answer."""
        answers = [part.set_role(command) for part in self.parts.values()]
        first = answers[0]
        self.role = first.role
        if first.role is not Role.HP:
            self.ticket_open = False
        return RoleChanged(instance_id=self.instance_id, role=first.role, mode=first.mode,
                           returned=[r for a in answers for r in a.returned],
                           load=self.load() if any(a.load for a in answers) else None)

    # ---- the step ----------------------------------------------------------------------
    def budgets(self, now: float) -> dict[str, int]:
        """Each model's share of this step's token budget (policies/mux_share.py)."""
        names, weights = self.names, []
        for name in names:
            count, since = self._arrivals[name]
            weights.append(model_weight(decayed(count, 0.0 if since is None else now - since),
                                        self._tbt_slo[name]))
        demands = [_demand(self.parts[n]) for n in names]
        return dict(zip(names, split_budget(self.token_budget, weights, demands)))

    def begin_step(self, now: float) -> tuple[MuxBatch, list[Output]]:
        budgets = self.budgets(now)
        order = self.names[self._first:] + self.names[:self._first]
        self._first = (self._first + 1) % len(self.names)
        parts = []
        for name in order:
            part = self.parts[name]
            if not part.has_work:
                continue
            part.scheduler.token_budget = max(1, budgets[name])
            parts.append((name, part.scheduler.schedule(now)))
        batch = MuxBatch(parts)
        if batch:
            return batch, []
        if self.has_work and not any(b.has_events for _, b in parts):
            raise RuntimeError("multiplexed instance made no progress: "
                               + ", ".join(f"{n}: {len(p.scheduler.waiting)} waiting, "
                                           f"{len(p.scheduler.running)} running"
                                           for n, p in self.parts.items()))
        return batch, self.finish_step(batch, [], 0.0, now)

    def finish_step(self, batch: MuxBatch, sampled: list[int], seconds: float, now: float,
                    ) -> list[Output]:
        """Each part's tokens (the sampled ones in the parts' order), merged into one
        StepOutputs; then what left each part's queue; then at most one Ticket."""
        ran = [name for name, part_batch in batch.parts if part_batch]
        learn = len(ran) == 1  # only a step of one model times that model alone
        steps: list[StepOutputs] = []
        others: list[Output] = []
        at = 0
        for name, part_batch in batch.parts:
            n = part_batch.num_sampling
            for message in self.parts[name].finish_step(part_batch, sampled[at:at + n],
                                                        seconds, now, learn=learn):
                if isinstance(message, StepOutputs):
                    steps.append(message)
                elif not isinstance(message, Ticket):
                    others.append(message)
            at += n
        if at != len(sampled):
            raise ValueError(f"{len(sampled)} sampled tokens for {at} sampling chunks")
        messages: list[Output] = []
        if steps:
            self.num_steps += 1
            messages.append(StepOutputs(
                instance_id=self.instance_id, step=self.num_steps, time=now,
                step_seconds=seconds, tokens=_merge_tokens([s.tokens for s in steps]),
                load=self.load(), cached=[c for s in steps for c in s.cached],
                admitted=[r for s in steps for r in s.admitted]))
        return messages + others + self.ask_for_work()

    def ask_for_work(self) -> list[Output]:
        """HP: one ticket for the instance, with nothing waiting and room in seats and pool."""
        if self.role is not Role.HP:
            return []
        waiting = sum(len(p.scheduler.waiting) for p in self.parts.values())
        running = sum(len(p.scheduler.running) for p in self.parts.values())
        if not ticket_wanted(waiting, running, TICKET_BATCH_LIMIT,
                             self.pool.free_units / self.pool.num_units, self.ticket_open):
            return []
        self.ticket_open = True
        return [Ticket(instance_id=self.instance_id)]

    # ---- reports -----------------------------------------------------------------------
    def blocks_in_use(self) -> dict[str, int]:
        """Each model's KV blocks held by its requests, in its own blocks."""
        return {name: self.pool.used_by.get(name, 0) // part.kv.block_units
                for name, part in self.parts.items()}

    def load(self) -> InstanceLoad:
        loads = [part.load() for part in self.parts.values()]
        first = self.parts[self.names[0]]
        return InstanceLoad(
            sum(x.accepted for x in loads), sum(x.queued_prefill_tokens for x in loads),
            sum(x.queued_prefill_seconds for x in loads), sum(x.num_running for x in loads),
            sum(x.prefill_rate for x in loads),
            self.pool.used_units // first.kv.block_units,
            sum(x.queued_sheddable_tokens for x in loads))

    def ready(self, pid: int, executor_kind: str) -> Ready:
        """Its first model's Ready (curve, context, budget), naming every model."""
        first = self.parts[self.names[0]].ready(pid, executor_kind)
        return Ready(**{f: getattr(first, f) for f in first.__struct_fields__}
                     | {"models": list(self.names)})

    def heartbeat(self, now: float, num_bad_frames: int = 0, ping_id: int | None = None,
                  ) -> Heartbeat:
        """The parts' counts summed; KV in the first model's blocks, and each model's own."""
        beats = [part.heartbeat(now, num_bad_frames, ping_id) for part in self.parts.values()]
        first = self.parts[self.names[0]]
        summed = {f: sum(getattr(b, f) for b in beats) for f in _SUMMED}
        return Heartbeat(
            instance_id=self.instance_id, time=now, ping_id=ping_id, **summed,
            num_kv_blocks_used=self.pool.used_units // first.kv.block_units,
            num_kv_blocks=first.kv.num_blocks, num_steps=self.num_steps,
            num_bad_frames=num_bad_frames, perf_model_mape=beats[0].perf_model_mape,
            kv_blocks_by_model=self.blocks_in_use())


#: Heartbeat counts a multiplexed instance sums over its models.
_SUMMED = ("num_waiting", "num_running", "num_preemptions", "num_finished", "num_offloaded",
           "num_dropped", "prefix_queried_blocks", "prefix_hit_blocks", "prefix_queried_tokens",
           "prefix_hit_tokens")


def _demand(part: InstanceCore) -> int:
    """Tokens a model could run this step: one per running decode, its prompts' rest."""
    scheduler = part.scheduler
    return (scheduler.waiting.uncomputed_tokens()
            + sum(r.num_uncomputed_tokens for r in scheduler.running))


def _merge_tokens(columns: list[StepTokens]) -> StepTokens:
    """Several parts' step tokens as one message's columns (positions moved on)."""
    if len(columns) == 1:
        return columns[0]
    request_ids, token_ids, finished, logprobs = [], [], {}, {}
    for tokens in columns:
        at = len(request_ids)
        request_ids += tokens.request_ids
        token_ids += tokens.token_ids
        finished.update({at + i: reason for i, reason in tokens.finished.items()})
        logprobs.update({at + i: lp for i, lp in tokens.logprobs.items()})
    return StepTokens(request_ids, token_ids, finished, logprobs)
