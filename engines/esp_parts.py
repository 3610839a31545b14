"""An instance's parts in ESP groups (elastic sequence parallelism), sans-I/O: the
instance core's component for them (engines/models/sequence_parallel.py has the model).

A request's ESP group is k instances; this one is its master (it got the request's
`Submit` with `esp` set, and decodes it afterwards) or one of its other holders (it got
an `EspJoin`). A part's life:

    joined   room for its stripe of the prompt is held in this instance's KV cache (a
             placeholder request owns the blocks), and `EspJoined` answers the controller
             (or says why it cannot: no room)
    go       `EspGo` came: at its step boundaries the instance runs the group's prefill
             in chunks (`EspStep`s: each rank's share of a chunk at most its step's token
             budget, Sarathi's bound), in the order the Go's came (the controller sends
             every group's Go's in one order, so no two instances wait for each other's
             groups); between two chunks it may run a step of its own running decodes
             (engines/instance_core.py says when)
    held     after the last chunk: a holder keeps its stripe's KV until `EspLeave`; the master
             frees its placeholder and takes the request into its scheduler with every
             prompt token but the last computed -- its next ordinary step computes that one
             (a decode-like query over the group's KV) and samples the first token.

An instance whose executor carries real KV (`gathers`: the torch executor, the live path)
scales down by moving the KV instead: the master's placeholder holds room for the whole
prompt, the step ends with every stripe gathered into it (`EspSequence.gather_to`), and
its blocks become the request's (it then decodes as any request); the holders' stripes
are freed at once, their part done. The simulator's executors keep the stripes where
they were made (LoongServe's multi-master decode, priced by engines/executors/profiles).

The master's scheduler accounts the blocks of the whole context, as for any request it
decodes, though 1/k of them are in its cache: the instance's KV use is over-counted by the
stripes the others hold (a conservative error: admission sees less room than there is).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from engines.kv_cache import BlockManager
from engines.models.stripes import stripe_len
from engines.request import Request
from ipc.messages import EspJoined, EspPart, Submit
from ipc.params import SamplingParams


@dataclass
class EspStep:
    """One chunk of the group's prefill of one request, as this instance runs it: its
    stripe of prompt positions `begin`..`end`-1 of the first `num_tokens` (all but the
    last), rank `rank` of `degree` (`end` None: the whole `num_tokens`, one chunk)."""

    request_id: str
    num_tokens: int
    degree: int
    rank: int
    begin: int = 0
    end: int | None = None
    #: The prompt tokens the step computes (`num_tokens` of them) and the blocks of this
    #: instance's part: its stripe's (a holder's), the whole prompt's (a gathering master).
    token_ids: list[int] = field(default_factory=list, repr=False, compare=False)
    block_table: list[int] = field(default_factory=list, repr=False, compare=False)

    @property
    def master(self) -> bool:
        return self.rank == 0

    @property
    def stop(self) -> int:
        """The chunk's end position (exclusive)."""
        return self.num_tokens if self.end is None else self.end

    @property
    def last(self) -> bool:
        """The group's prefill ends with this chunk."""
        return self.stop >= self.num_tokens


@dataclass
class _Part:
    step: EspStep
    placeholder: Request        # owns the stripe's blocks
    submit: Submit | None       # the master's: the request itself
    go: bool = False
    #: Left (ended, aborted) after its Go: the step still runs -- every member of the
    #: group runs a Go'd step, or the others would wait for it forever -- then it is freed.
    gone: bool = False
    #: The master's: a member stopped after the Go, so the others' KV will not be there:
    #: after the step the request recomputes its prompt here.
    lost: bool = False
    #: Prompt positions the group's chunks have computed so far.
    done: int = 0


class EspParts:
    """The parts by request id; `steps_due`: Go'd steps, in the order the Go's came."""

    def __init__(self, instance_id: int, kv: BlockManager, gathers: bool = False) -> None:
        self.instance_id = instance_id
        self.kv = kv
        self.gathers = gathers
        self.parts: dict[str, _Part] = {}
        self.steps_due: list[str] = []

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.parts

    @property
    def has_step(self) -> bool:
        return bool(self.steps_due)

    def join(self, request_id: str, prompt: list[int], part: EspPart,
             submit: Submit | None) -> EspJoined:
        """Hold room for this instance's stripe; the answer to the controller."""
        if request_id in self.parts:
            raise ValueError(f"duplicate request id {request_id!r}")
        degree = len(part.group)
        num_tokens = len(prompt) - 1
        if not 0 <= part.rank < degree or num_tokens < degree:
            return EspJoined(instance_id=self.instance_id, request_id=request_id,
                             refused=f"a {len(prompt)}-token prompt cannot be split over "
                                     f"{degree} instances as rank {part.rank}")
        mine = stripe_len(num_tokens, degree, part.rank)
        room = num_tokens if self.gathers and part.rank == 0 else mine
        placeholder = Request(request_id, [0] * room, SamplingParams(max_tokens=1))
        if not self.kv.allocate(placeholder, room):
            return EspJoined(instance_id=self.instance_id, request_id=request_id,
                             refused=f"no KV room for its {room}-token part")
        step = EspStep(request_id, num_tokens, degree, part.rank,
                       token_ids=list(prompt[:num_tokens]) if self.gathers else [],
                       block_table=placeholder.block_table)
        self.parts[request_id] = _Part(step, placeholder, submit)
        return EspJoined(instance_id=self.instance_id, request_id=request_id)

    def go(self, request_id: str) -> None:
        part = self.parts.get(request_id)
        if part is not None and not part.go:
            part.go = True
            self.steps_due.append(request_id)

    def alone(self, request_id: str) -> Submit | None:
        """The group did not form (no Go): the master's request, to serve by itself
        (None where this instance is not its master)."""
        part = self.parts.get(request_id)
        if part is None or part.submit is None or part.go:
            return None
        self._forget(request_id)
        return part.submit

    def next_step(self, chunk_tokens: int) -> EspStep:
        """The next chunk of the first Go'd group: each rank's stripe of it at most
        `chunk_tokens` query tokens (every member's token budget: one SchedulerConfig)."""
        part = self.parts[self.steps_due[0]]
        step = part.step
        end = min(step.num_tokens, part.done + chunk_tokens * step.degree)
        return replace(step, begin=part.done, end=end)

    def stepped(self, step: EspStep, failed: bool = False,
                ) -> tuple[Submit | None, int, list[int]]:
        """The group's step ran: a holder keeps its stripe (a gathering one is done with
        it: freed); the master's request (to take into its scheduler) is returned with its
        prompt tokens whose KV the group holds (0 when a member was lost, or the step
        `failed`), and its placeholder freed -- or, gathering, the placeholder's blocks,
        which now hold the whole prompt's KV, for the request to take. A part that left
        meanwhile is freed now (and has no request to return). A chunk before the last
        only moves the part on (nothing to return), unless it `failed` or a member was
        lost: then the group's prefill ends there."""
        part = self.parts[step.request_id]
        part.done = step.stop
        if not (step.last or failed or part.lost):
            return None, 0, []
        self.steps_due.remove(step.request_id)
        if part.gone or not step.master:
            if part.gone or self.gathers:
                self._forget(step.request_id)
            return None, 0, []
        if part.lost or failed:
            self._forget(step.request_id)
            return part.submit, 0, []
        if self.gathers:
            del self.parts[step.request_id]
            blocks, part.placeholder.block_table = part.placeholder.block_table, []
            return part.submit, step.num_tokens, blocks
        self._forget(step.request_id)
        return part.submit, step.num_tokens, []

    def lose(self, request_id: str) -> bool:
        """A member of the group stopped: a master not yet Go'd serves the request alone
        (False: the caller does that), a Go'd one recomputes it after the step (True)."""
        part = self.parts.get(request_id)
        if part is None or not part.go:
            return False
        part.lost = True
        return True

    def lost(self, request_id: str) -> bool:
        """Whether a member of this part's group stopped (the driver waiting in its step
        for the others stops waiting: `finish_esp(failed=True)`)."""
        part = self.parts.get(request_id)
        return part is not None and part.lost

    def leave(self, request_id: str) -> bool:
        """Forget the part, its blocks freed -- after its step if that is Go'd and has not
        run; False if unknown."""
        part = self.parts.get(request_id)
        if part is None or part.gone:
            return False
        if request_id in self.steps_due:
            part.gone = True
        else:
            self._forget(request_id)
        return True

    def _forget(self, request_id: str) -> None:
        self.kv.free(self.parts.pop(request_id).placeholder)

    def pending_masters(self) -> list[str]:
        """The requests this instance is master of whose step has not run and that are
        still wanted (an Abort ends them, a Shutdown aborts them)."""
        return [rid for rid, part in self.parts.items()
                if part.submit is not None and not part.gone]
