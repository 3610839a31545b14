"""Serving one API request's choices -- each its own engine request -- as one response.

`submit` hands every choice to the controller (`{id}-{index}` when there are several);
if one is refused, those already accepted are cancelled and the refusal is the answer.
`complete` waits for every choice and builds one body; `stream` sends each choice's
tokens as they come, one SSE chunk per token carrying its choice's index, after every
choice has its first token (so an error before that is still a JSON status). Each time
it wakes it takes every token already queued for any choice and writes all their
events at once (daemon/stream_events.py) -- one write, not one per token, and no token
waits for another. Whatever ends the request -- the last token, a stop string, an
error, the client leaving -- every choice's handle is closed, which aborts what is
still running. Asked for (`return_serving_info`), the answer says where each choice ran
(`serving_info`, from the core's `Settle` of each): once they have all ended, so it
goes at the end -- in the body, a stream's last chunk, or beside its error.
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterable

import msgspec
from aiohttp import web

from daemon.core.events import Settle
from daemon.detokenizer import IncrementalDetokenizer
from daemon.errors import ApiError
from daemon.logprobs import ChatLogprobs, CompletionLogprobs, TokenText
from daemon.request_plan import Choice
from daemon.core.request_state import Outcome
from daemon.responses import ResponseBuilder, usage
from daemon.tenant_headers import Identity
from daemon.stream_events import DONE, StreamEvents
from daemon.tool_calls import ToolCallStream, ToolPlan
from ipc.serving_info import ChoiceServing, ServingInfo
from ipc.tenancy import QUEUE_DURATION_HEADER


class RunningChoice:
    """One choice in flight: its stream from the controller, text and log-probabilities."""

    def __init__(self, choice: Choice, handle, tokenizer, stops: list[str],
                 token_text: TokenText | None, chat: bool, tools: ToolPlan | None = None) -> None:
        self.index = choice.index
        self.handle = handle
        self.echo = choice.prompt.text
        self.detok = IncrementalDetokenizer(tokenizer, stops)
        self.count = 0
        self.text = ""              # all of it, for a full response
        self.finish: str | None = None
        self.started = False
        self.logprobs = None
        #: With tools: which of its text is content and which is calls (daemon/tool_calls.py)
        self.tool_calls = ToolCallStream(tools) if tools is not None else None
        if token_text is not None:
            self.logprobs = ChatLogprobs(token_text) if chat else \
                CompletionLogprobs(token_text, offset=len(self.echo))

    def add(self, output) -> str:
        """Take one token; the text that became final (the echo before the first)."""
        self.count += 1
        text = self.detok.add(output.token_id)
        if self.logprobs is not None and output.logprobs is not None:
            self.logprobs.add(output.token_id, output.logprobs)
        self.finish = "stop" if self.detok.stopped else output.finish_reason
        if self.finish:
            text += self.detok.flush()
        if not self.started:
            self.started, text = True, self.echo + text
        return text

    def close(self) -> None:
        self.handle.close(Outcome.COMPLETED if self.detok.stopped else Outcome.CANCELLED)

    @property
    def finish_reason(self) -> str:
        """OpenAI's: "tool_calls" for a reply that made calls and ended on its own."""
        finish = self.finish or "length"
        if finish == "stop" and self.tool_calls is not None and self.tool_calls.calls:
            return "tool_calls"
        return finish


async def submit(controller, choices: list[Choice], request_id: str, body,
                 who: Identity = Identity(), ttl: float | None = None) -> list:
    """Every choice's handle, in order; a refusal cancels those already accepted. `who`:
    its tenant and priority band (daemon/tenant_headers.py); `ttl`: its queue TTL, s."""
    handles = []
    try:
        for choice in choices:
            handles.append(await controller.submit(
                choice.prompt.token_ids, choice.sampling, ttft_slo=body.ttft_slo,
                tbt_slo=body.tbt_slo, priority=who.priority, tenant=who.tenant, ttl=ttl,
                request_id=request_id if len(choices) == 1 else f"{request_id}-{choice.index}"))
    except BaseException:
        for handle in handles:
            handle.close(Outcome.CANCELLED)
        raise
    return handles


def queue_header(running: list[RunningChoice]) -> dict[str, str]:
    """x-llm-d-flow-queue-duration-ms: integer ms from arrival to the start of its
    prefill (the longest of its choices'); absent when none has started."""
    delays = [r.handle.queue_delay for r in running if r.handle.queue_delay is not None]
    return {QUEUE_DURATION_HEADER: str(round(1000 * max(delays)))} if delays else {}


def usage_counts(running: list[RunningChoice], choices: list[Choice]) -> tuple[int, int, int]:
    """(prompt tokens, each prompt once; completion tokens, all choices; prompt tokens
    found in the prefix cache, each prompt once: the least any of its choices found)."""
    prompts = {id(c.prompt): len(c.prompt.token_ids) for c in choices}
    cached: dict[int, int] = {}
    for choice, r in zip(choices, running):
        found = r.handle.num_cached_tokens
        cached[id(choice.prompt)] = min(found, cached.get(id(choice.prompt), found))
    return sum(prompts.values()), sum(r.count for r in running), sum(cached.values())


async def _collect(choice: RunningChoice) -> None:
    pieces = []
    async for output in choice.handle.tokens():
        pieces.append(choice.add(output))
        if choice.finish:
            break
    choice.text = "".join(pieces)


async def _all(coros) -> list:
    """Await every one; on the first failure cancel the rest and raise it."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


def serving_info(running: list[RunningChoice]) -> ServingInfo:
    """Where each choice ran (docs/api.md#serving-info): the core's last word on each one
    that has ended -- every one, once its handle is closed."""
    return ServingInfo([choice_serving(r.index, r.handle.settled) for r in running
                        if r.handle.settled is not None])


def choice_serving(index: int, settled: Settle) -> ChoiceServing:
    return ChoiceServing(index=index, instances=list(settled.instances),
                         offloaded=settled.offloaded,
                         role=settled.role.value if settled.role is not None else None,
                         queue_delay=settled.queue_delay)


async def complete(running: list[RunningChoice], choices: list[Choice],
                   builder: ResponseBuilder, serving: bool = False) -> web.Response:
    """The whole response as one body; `serving`: with `serving_info`."""
    try:
        await _all(_collect(r) for r in running)
    finally:
        for r in running:
            r.close()
    bodies = [_choice_body(builder, r) for r in running]
    body = builder.full(bodies, *usage_counts(running, choices))
    if serving:
        body["serving_info"] = msgspec.to_builtins(serving_info(running))
    return web.json_response(body, headers=queue_header(running))


def _choice_body(builder: ResponseBuilder, r: RunningChoice) -> dict:
    logprobs = r.logprobs.whole() if r.logprobs is not None else None
    if r.tool_calls is None:
        return builder.choice(r.index, r.text, r.finish_reason, logprobs)
    r.tool_calls.add(r.text, final=True)
    return builder.choice(r.index, r.tool_calls.content(), r.finish_reason, logprobs,
                          r.tool_calls.calls)


def _add_events(choice: RunningChoice, items: Iterable, events: StreamEvents,
                out: bytearray) -> None:
    """Append one event per token of `items` to `out`; an error in them is raised (the
    events of the tokens before it are in `out`). Tokens after a stop string are dropped."""
    for item in items:
        if choice.finish:
            break
        if isinstance(item, ApiError):
            raise item
        first = not choice.started
        text = choice.add(item)
        logprobs = choice.logprobs.take() if choice.logprobs is not None else None
        # one event per token, even when its text is still held back (a partial
        # character, a possible stop string): clients time tokens by events
        if choice.tool_calls is None:
            events.token(out, choice.index, text, choice.finish, first, logprobs, choice.count)
            continue
        text, calls = choice.tool_calls.add(text, final=bool(choice.finish))
        finish = choice.finish_reason if choice.finish else None
        events.token(out, choice.index, text, None if calls else finish, first, logprobs,
                     choice.count)
        if calls:
            events.tool_calls(out, choice.index, calls)
            if finish:
                events.token(out, choice.index, "", finish, completion_tokens=choice.count)
    if choice.finish:
        choice.close()


async def stream(request: web.Request, running: list[RunningChoice], choices: list[Choice],
                 builder: ResponseBuilder, include_usage: bool,
                 serving: bool = False, continuous_usage: bool = False) -> web.StreamResponse:
    """`serving`: `serving_info` in a last chunk with no choices (the usage chunk, when
    `include_usage`), or beside the error of a stream that fails."""
    response = None
    try:
        firsts = await _all(r.handle.first() for r in running)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache",
                                               **queue_header(running)})
        await response.prepare(request)
        prompt_tokens = usage_counts(running, choices)[0] if continuous_usage else None
        events, out = StreamEvents(builder, prompt_tokens), bytearray()
        ready = asyncio.Event()  # any choice has tokens queued
        for choice in running:
            choice.handle.listen(ready)
        try:
            for choice, first in zip(running, firsts):
                _add_events(choice, (first,), events, out)
            while True:
                ready.clear()  # before taking: a token put after this wakes the wait below
                for choice in running:
                    if not choice.finish:
                        _add_events(choice, choice.handle.take(), events, out)
                if all(choice.finish for choice in running):
                    break
                if out:  # now, whatever came in: no token waits for more
                    await response.write(out)
                    out = bytearray()
                await ready.wait()
            if include_usage or serving:
                events.last(out, usage(*usage_counts(running, choices)) if include_usage else None,
                            serving_info(running) if serving else None)
            out += DONE
            await response.write(out)
        except ApiError as exc:  # failed mid-stream: an SSE error event, then the end marker
            for r in running:  # the others end with it: all settled, for serving_info
                r.close()
            events.error(out, exc.message, exc.status, exc.code,
                         serving_info(running) if serving else None)
            out += DONE
            await response.write(out)
        return response
    except ConnectionResetError:  # the client left mid-stream: its choices are cancelled
        return response
    finally:
        for r in running:
            r.close()
