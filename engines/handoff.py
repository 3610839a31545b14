"""P/D disaggregation inside one instance, sans-I/O: the two ends of a KV hand-off.

A P/D layout (`<n>P<m>D`, DistServe) splits a request's life across two instances:

* `hand_off` (prefill instance, after a step): every request that has just got a token
  and goes on leaves the instance, its blocks freed. Its `Handoff` message goes to the
  controller; when the executor keeps a KV cache (`carries_kv`) it comes as an `ExportKv`
  instead: the blocks whose KV must travel, for the driver to copy out (`export_kv`) and
  send as raw frames after the message -- before it runs another step, the only thing
  that writes into freed blocks.
* `PrefilledQueue` and `take_in` (decode instance, on a `SubmitPrefilled`): the request
  is rebuilt with every token it has so far and waits until the instance has a seat and
  the blocks for it; then the blocks are allocated and, when its KV came with it, an
  `ImportKv` tells the driver to write the frames in (`import_kv`) before the next step
  (it decodes on from there). The frames stay with the driver meanwhile: the channel
  hands them over with their message. KV it cannot use (or a request too big to ever fit
  beside nothing) is recomputed instead, as a request preempted by recompute would be:
  greedy output is the same either way; KV the executor refuses (`import_kv` raises) is
  reported back (`InstanceCore.refuse_kv`) and the request refused.

Executors without a cache (the sim executor) move nothing and no KV action is made: a
simulator charges the transfer time on its own clock.
"""
from __future__ import annotations

import logging
from typing import NamedTuple

from engines.request import Request
from engines.scheduler import Scheduler
from ipc.messages import Handoff, KvLayout, StepTokens, SubmitPrefilled

log = logging.getLogger(__name__)


class ExportKv(NamedTuple):
    """Send `handoff` with the KV of the first `num_tokens` tokens in `block_ids` (the
    driver's `executor.export_kv`: its layout in the message, its frames after it)."""

    handoff: Handoff
    block_ids: list[int]
    num_tokens: int


class ImportKv(NamedTuple):
    """Write the KV frames that came with request `request_id`'s SubmitPrefilled into
    `block_ids` (the driver's `executor.import_kv`) before the next step; if the executor
    refuses them, tell the core (`InstanceCore.refuse_kv`)."""

    request_id: str
    block_ids: list[int]
    layout: KvLayout


def hand_off(scheduler: Scheduler, tokens: StepTokens, instance_id: int, carries_kv: bool,
             ) -> list[Handoff | ExportKv]:
    """The hand-offs of one step's `tokens`, one per request that got a token and did not
    finish: its Handoff, or an ExportKv when its KV travels too (`carries_kv`). Each leaves
    the scheduler (its blocks are free on return; their contents stay until the next step)."""
    handoffs: list[Handoff | ExportKv] = []
    for i, request_id in enumerate(tokens.request_ids):
        if i in tokens.finished:
            continue
        request = scheduler.requests.get(request_id)
        if request is None or not request.is_decoding:
            continue
        handoff = Handoff(instance_id=instance_id, request_id=request.request_id,
                          token_ids=list(request.token_ids),
                          num_computed_tokens=request.num_computed_tokens)
        handoffs.append(ExportKv(handoff, list(request.block_table), request.num_computed_tokens)
                        if carries_kv else handoff)
        scheduler.abort(request.request_id)
    return handoffs


def prefilled_request(message: SubmitPrefilled, deadline: float) -> Request:
    """The request a SubmitPrefilled describes, every token it has so far; ValueError
    when the message does not describe one (the caller answers with a RequestError)."""
    submit = message.submit
    prompt = submit.prompt_token_ids
    if message.token_ids[:len(prompt)] != prompt or len(message.token_ids) <= len(prompt):
        raise ValueError("a prefilled request's tokens must be its prompt and at least one "
                         "generated token")
    if message.num_computed_tokens != len(message.token_ids) - 1:
        raise ValueError(f"a prefilled request must have every token but its newest cached; "
                         f"it has {message.num_computed_tokens} of {len(message.token_ids)}")
    request = Request(submit.request_id, prompt, submit.sampling,
                      arrival_time=submit.arrival_time, deadline=deadline,
                      priority=submit.priority, tbt_slo=submit.tbt_slo or float("inf"),
                      pinned=True, generated_before=submit.generated_before)
    request.token_ids.extend(message.token_ids[len(prompt):])
    return request


class Prefilled(NamedTuple):
    request: Request
    kv: KvLayout | None  # the header of the KV frames the driver holds for it


class PrefilledQueue:
    """A decode instance's prefilled requests that wait for a seat and KV blocks, oldest
    first (a DistServe decode instance pulls a request's KV only once it has room; the
    driver keeps the frames till then). `admit` takes in what fits; with nothing running
    it takes the oldest in even so (it recomputes there), so the queue never stalls."""

    def __init__(self) -> None:
        self._queue: dict[str, Prefilled] = {}

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._queue

    def add(self, scheduler: Scheduler, item: Prefilled) -> None:
        request_id = item.request.request_id
        if request_id in self._queue or request_id in scheduler.requests:
            raise ValueError(f"duplicate request id {request_id!r}")
        self._queue[request_id] = item

    def remove(self, request_id: str) -> bool:
        return self._queue.pop(request_id, None) is not None

    def ids(self) -> list[str]:
        return list(self._queue)

    def admit(self, scheduler: Scheduler, carries_kv: bool) -> list[ImportKv]:
        """Take in, oldest first, every request that fits now; the KV each brought that the
        driver must write into its blocks (`carries_kv`: the executor keeps a KV cache)."""
        imports = []
        while self._queue:
            request_id, item = next(iter(self._queue.items()))
            if scheduler.running and not _fits(scheduler, item.request):
                break
            del self._queue[request_id]
            kv_import = take_in(scheduler, item, carries_kv)
            if kv_import is not None:
                imports.append(kv_import)
        return imports


def _fits(scheduler: Scheduler, request: Request) -> bool:
    return (len(scheduler.running) < scheduler.max_num_seqs
            and scheduler.kv.can_allocate(request, request.num_tokens - 1))


def take_in(scheduler: Scheduler, item: Prefilled, carries_kv: bool) -> ImportKv | None:
    """Run the request here from its KV (or recompute it: no room, or no usable KV); the
    import to make when its KV is to be written in. The channel hands a SubmitPrefilled
    over with exactly as many frames as its `kv` header has layers, so the header says
    whether the KV came with it."""
    request, kv = item
    usable = (kv is None) is not carries_kv
    if not usable:
        log.warning("request %s: its KV did not come with it (%s); recomputing it",
                    request.request_id, "an executor without a KV cache" if kv else "no frames")
    cached = request.num_tokens - 1 if usable else 0
    if scheduler.add_prefilled(request, cached):
        if cached and carries_kv:
            return ImportKv(request.request_id, list(request.block_table), kv)
    elif cached:
        log.info("request %s: no room for its KV here; recomputing it", request.request_id)
    return None
