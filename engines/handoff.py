"""P/D disaggregation inside one instance, sans-I/O: the two ends of a KV hand-off.

A P/D layout (`<n>P<m>D`, DistServe) splits a request's life across two instances:

* `hand_off` (prefill instance, after a step): every request that has just got a token
  and goes on leaves the instance -- its KV is copied out of the executor's cache (when
  the executor keeps one: `export_kv`), then its blocks are freed. The caller sends a
  `Handoff` per request, with the copied layers as raw frames after it.
* `PrefilledQueue` and `take_in` (decode instance, on a `SubmitPrefilled`): the request
  is rebuilt with every token it has so far and waits, its KV frames with it, until the
  instance has a seat and the blocks for it; then the blocks are allocated, the KV is
  written in (`import_kv`), and it decodes on from the next step. KV it cannot use (or
  a request too big to ever fit beside nothing) is recomputed instead, as a request
  preempted by recompute would be: greedy output is the same either way.

Executors without a cache (the sim executor) move nothing: a simulator charges the
transfer time on its own clock.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NamedTuple

from engines.engine import Engine
from engines.request import Request
from ipc.messages import Handoff, KvLayout, SubmitPrefilled, TokenOutput

log = logging.getLogger(__name__)


def hand_off(engine: Engine, outputs: Sequence[TokenOutput], instance_id: int,
             ) -> list[tuple[Handoff, list]]:
    """The hand-offs of one step's `outputs`: (message, KV frames) per request that got a
    token and did not finish. Each leaves the engine (its blocks are free on return)."""
    handoffs = []
    for output in outputs:
        if output.finish_reason is not None:
            continue
        request = engine.scheduler.requests.get(output.request_id)
        if request is None or not request.is_decoding:
            continue
        layout, frames = _export(engine, request)
        handoffs.append((Handoff(instance_id=instance_id, request_id=request.request_id,
                                 token_ids=list(request.token_ids),
                                 num_computed_tokens=request.num_computed_tokens, kv=layout),
                         frames))
        engine.abort(request.request_id)
    return handoffs


def _export(engine: Engine, request: Request):
    return engine.executor.export_kv(request.block_table, request.num_computed_tokens)


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
    kv: KvLayout | None
    frames: Sequence


class PrefilledQueue:
    """A decode instance's prefilled requests that wait for a seat and KV blocks, oldest
    first, their KV frames with them (a DistServe decode instance pulls a request's KV
    only once it has room). `admit` takes in what fits; with nothing running it takes the
    oldest in even so (it recomputes there), so the queue never stalls."""

    def __init__(self) -> None:
        self._queue: dict[str, Prefilled] = {}

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._queue

    def add(self, engine: Engine, item: Prefilled) -> None:
        request_id = item.request.request_id
        if request_id in self._queue or request_id in engine.scheduler.requests:
            raise ValueError(f"duplicate request id {request_id!r}")
        self._queue[request_id] = item

    def remove(self, request_id: str) -> bool:
        return self._queue.pop(request_id, None) is not None

    def ids(self) -> list[str]:
        return list(self._queue)

    def admit(self, engine: Engine) -> list[tuple[str, str]]:
        """Take in, oldest first, every request that fits now; (request id, why) of each
        that could not be served here after all (its KV did not fit this cache)."""
        refused = []
        while self._queue:
            request_id, item = next(iter(self._queue.items()))
            if engine.scheduler.running and not _fits(engine, item.request):
                break
            del self._queue[request_id]
            try:
                take_in(engine, item)
            except ValueError as exc:
                refused.append((request_id, str(exc)))
        return refused


def _fits(engine: Engine, request: Request) -> bool:
    scheduler = engine.scheduler
    return (len(scheduler.running) < scheduler.max_num_seqs
            and engine.kv.can_allocate(request, request.num_tokens - 1))


def take_in(engine: Engine, item: Prefilled) -> None:
    """Run the request here from its KV (or recompute it: no room, or no usable KV);
    ValueError (and nothing kept) when its KV does not fit this cache."""
    request, kv, frames = item
    executor = engine.executor
    usable = (kv is None and not executor.carries_kv) or (
        kv is not None and executor.carries_kv and len(frames) == kv.num_layers)
    if not usable:
        log.warning("request %s: its KV did not come with it (%d of %s frames); recomputing "
                    "it", request.request_id, len(frames), kv.num_layers if kv else "no")
    cached = request.num_tokens - 1 if usable else 0
    if engine.scheduler.add_prefilled(request, cached):
        if cached and executor.carries_kv:
            try:
                executor.import_kv(request.block_table, kv, frames)
            except ValueError:  # frames that do not fit this cache: refused, nothing kept
                engine.abort(request.request_id)
                raise
    elif cached:
        log.info("request %s: no room for its KV here; recomputing it", request.request_id)
