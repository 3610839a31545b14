"""The coalesced SSE stream (daemon/response_streamer.py `stream`, daemon/stream_events.py): however
many tokens are queued when the handler wakes, exactly one `data:` event per token, in
order, then the usage chunk and [DONE]; a token is written as soon as it is queued (none
waits for more); an error after queued tokens follows their events. In-process over a
fake controller whose handles are filled before the handler reads them.

Covers: daemon/response_streamer.py, daemon/stream_events.py.
"""
from __future__ import annotations

import asyncio
import json

import msgspec
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from daemon.batch_histogram import BatchHistogram
from daemon.core.events import Settle, Tokens
from daemon.core.request_state import Outcome
from daemon.detokenizer import IncrementalDetokenizer
from daemon.errors import ApiError
from daemon.metrics import LATENCY_BUCKETS, Metrics
from daemon.request_handle import RequestHandle
from daemon.responses import ResponseBuilder
from daemon.stream_events import StreamEvents
from ipc.messages import StepTokens, TokenOutput
from tests.api_fakes import FakeController, api_client
from tests.examples import examples

SENTENCE = "The quick brown fox jumps over the lazy dog, again and again."


class QueuedController(FakeController):
    """Every request's handle already holds all of `script(request_id)`'s items (token ids,
    or an ApiError) when `submit` returns: the stream finds them queued at once."""

    def __init__(self, tokenizer, script) -> None:
        super().__init__(tokenizer, max_model_len=4096)
        self.script = script

    async def submit(self, prompt_token_ids, sampling, *, request_id, **_):
        handle = RequestHandle(request_id, lambda h, outcome: self.open.pop(h.request_id, None))
        self.open[request_id] = handle
        items = self.script(request_id, sampling.max_tokens)
        for i, item in enumerate(items):
            if isinstance(item, ApiError):
                handle.fail(item)
            else:
                last = i == len(items) - 1
                handle.put(TokenOutput(request_id, item, "length" if last else None))
        return handle


def token_ids(tokenizer, count: int) -> list[int]:
    ids = tokenizer.encode(SENTENCE, add_bos=False)
    return (ids * (count // len(ids) + 1))[:count]


async def stream_events(client, path: str, body: dict) -> tuple[list[dict], bytes]:
    resp = await client.post(path, json={**body, "stream": True})
    raw = await resp.read()
    assert resp.status == 200, raw
    assert raw.endswith(b"data: [DONE]\n\n")
    events = [e for e in raw.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") and b"\n" not in e for e in events)
    return [json.loads(e[len(b"data: "):]) for e in events[:-1]], raw


async def test_many_queued_tokens_are_one_event_each_in_order(tokenizer):
    ids = token_ids(tokenizer, 300)
    controller = QueuedController(tokenizer, lambda rid, n: ids[:n])
    async with api_client(controller, max_tokens_limit=512) as client:
        chunks, _ = await stream_events(client, "/v1/completions", {
            "prompt": "Hi", "max_tokens": 300, "stream_options": {"include_usage": True}})
    *tokens, usage = chunks
    assert len(tokens) == 300
    assert all(len(c["choices"]) == 1 and c["choices"][0]["index"] == 0 for c in tokens)
    assert "".join(c["choices"][0]["text"] for c in tokens) == tokenizer.decode(ids)
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 299 + ["length"]
    assert len({(c["id"], c["created"], c["model"], c["object"]) for c in chunks}) == 1
    assert tokens[0]["object"] == "text_completion"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 300
    assert controller.open == {}


def per_token_events(tokenizer, ids: list[int], first_chunk: dict, chat: bool) -> bytes:
    """The events `ids` make when each is encoded on its own (as a stream that wrote each
    token as it came would send them), concatenated."""
    builder = ResponseBuilder(first_chunk["id"], first_chunk["model"], chat)
    builder.created = first_chunk["created"]
    events, detok, raw = StreamEvents(builder), IncrementalDetokenizer(tokenizer), b""
    for i, token in enumerate(ids):
        finish = "length" if i == len(ids) - 1 else None
        text = detok.add(token) + (detok.flush() if finish else "")
        one = bytearray()
        events.token(one, 0, text, finish, first=i == 0)
        raw += one
    return raw


def openai_chunk(first_chunk: dict, text: str, finish: str | None, chat: bool, first: bool) -> dict:
    """One token's chunk as OpenAI spells it (the shape clients parse)."""
    if chat:
        # a token with no text yet: {"content": ""}, as vLLM sends, never an empty delta
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    envelope = {k: first_chunk[k] for k in ("id", "object", "created", "model")}
    return {**envelope, "choices": [choice]}


@pytest.mark.parametrize("chat", [False, True])
async def test_tokens_queued_together_go_out_in_one_write_byte_identical_to_one_by_one(
        tokenizer, monkeypatch, chat):
    ids = token_ids(tokenizer, 50)
    controller = QueuedController(tokenizer, lambda rid, n: ids[:n])
    writes: list[bytes] = []
    write = web.StreamResponse.write

    async def recording_write(self, data):
        writes.append(bytes(data))
        return await write(self, data)

    monkeypatch.setattr(web.StreamResponse, "write", recording_write)
    path, body = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}) \
        if chat else ("/v1/completions", {"prompt": "Hi"})
    async with api_client(controller, max_tokens_limit=512) as client:
        chunks, raw = await stream_events(client, path, {
            **body, "max_tokens": 50, "stream_options": {"include_usage": True}})
    assert writes == [raw]  # all 50 were queued at once: one write carries every event
    per_token = per_token_events(tokenizer, ids, chunks[0], chat)
    assert raw.startswith(per_token)  # byte for byte what one write per token would send
    after = raw[len(per_token):]
    assert after.count(b"\n\n") == 2 and after.endswith(b"data: [DONE]\n\n")  # usage, end
    *tokens, usage = chunks
    texts = [c["choices"][0]["delta"].get("content", "") if chat else c["choices"][0]["text"]
             for c in tokens]
    assert len(tokens) == len(ids) and "".join(texts) == tokenizer.decode(ids)
    assert usage["usage"]["completion_tokens"] == len(ids)
    # each event is the compact JSON of OpenAI's chunk for its token
    for i, (event, text) in enumerate(zip(raw.split(b"\n\n"), texts)):
        finish = "length" if i == len(ids) - 1 else None
        expected = openai_chunk(chunks[0], text, finish, chat, first=i == 0)
        assert event == b"data: " + json.dumps(expected, separators=(",", ":")).encode()


async def test_queued_tokens_of_every_choice_keep_their_order(tokenizer):
    ids = token_ids(tokenizer, 40)
    controller = QueuedController(tokenizer, lambda rid, n: ids[:n])
    async with api_client(controller, max_tokens_limit=512) as client:
        chunks, _ = await stream_events(client, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "n": 3, "max_tokens": 40,
            "stream_options": {"include_usage": True}})
    *tokens, usage = chunks
    assert len(tokens) == 3 * 40 and usage["usage"]["completion_tokens"] == 120
    for index in range(3):
        mine = [c["choices"][0] for c in tokens if c["choices"][0]["index"] == index]
        assert len(mine) == 40
        assert mine[0]["delta"]["role"] == "assistant"
        assert all("role" not in c["delta"] and "content" in c["delta"] for c in mine[1:])
        assert "".join(c["delta"]["content"] for c in mine) == tokenizer.decode(ids)
        assert [c["finish_reason"] for c in mine][-2:] == [None, "length"]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


async def test_an_error_after_queued_tokens_follows_their_events(tokenizer):
    ids = token_ids(tokenizer, 5)
    error = ApiError(503, "the instance went away", "instance_lost")
    controller = QueuedController(tokenizer, lambda rid, n: [*ids, error])
    async with api_client(controller, max_tokens_limit=512) as client:
        chunks, _ = await stream_events(client, "/v1/completions",
                                        {"prompt": "Hi", "max_tokens": 50})
    assert len(chunks) == 6
    assert "".join(c["choices"][0]["text"] for c in chunks[:5]) == tokenizer.decode(ids)
    assert chunks[5]["error"]["message"] == "the instance went away"
    assert chunks[5]["error"]["code"] == "instance_lost"


async def test_queued_tokens_after_a_stop_string_are_not_sent(tokenizer):
    ids = token_ids(tokenizer, 60)
    controller = QueuedController(tokenizer, lambda rid, n: ids[:n])
    async with api_client(controller, max_tokens_limit=512) as client:
        chunks, _ = await stream_events(client, "/v1/completions", {
            "prompt": "Hi", "max_tokens": 60, "stop": ["lazy"]})
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == SENTENCE[:SENTENCE.index("lazy")]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert len(chunks) < 60


async def test_a_choice_stopped_by_a_stop_string_is_closed_while_others_stream(tokenizer):
    """Its request is aborted at once (close(COMPLETED)), not when the last choice ends."""
    ids = token_ids(tokenizer, 60)
    handles: dict[str, RequestHandle] = {}
    outcomes: dict[str, str] = {}
    controller = FakeController(tokenizer, max_model_len=4096)

    async def submit(prompt_token_ids, sampling, *, request_id, **_):
        handle = RequestHandle(request_id,
                               lambda h, outcome: outcomes.setdefault(h.request_id, outcome.value))
        handles[request_id] = handle
        for token in ids if request_id.endswith("-0") else ids[:1]:  # -1: then silence
            handle.put(TokenOutput(request_id, token))
        return handle

    controller.submit = submit
    async with api_client(controller, max_tokens_limit=512) as client:
        resp = await client.post("/v1/completions", json={
            "prompt": "Hi", "n": 2, "max_tokens": 100, "stop": ["lazy"], "stream": True})
        assert resp.status == 200
        for _ in range(500):
            if outcomes:
                break
            await asyncio.sleep(0.01)
        assert outcomes == {next(r for r in handles if r.endswith("-0")): "completed"}
        last = next(h for r, h in handles.items() if r.endswith("-1"))
        last.put(TokenOutput("r", ids[1], "length"))
        raw = await asyncio.wait_for(resp.read(), 30)
    assert raw.endswith(b"data: [DONE]\n\n")
    assert sorted(outcomes.values()) == ["cancelled", "completed"]  # -1 had finished itself


async def test_a_token_is_written_without_waiting_for_the_next(tokenizer):
    """The handler writes what is queued and only then waits: each token can be read
    before the next one exists (a server that held tokens back would hang here)."""
    ids = token_ids(tokenizer, 4)
    handles: list[RequestHandle] = []
    controller = FakeController(tokenizer)

    async def submit(prompt_token_ids, sampling, *, request_id, **_):
        handles.append(RequestHandle(request_id, lambda h, outcome: None))
        return handles[-1]

    controller.submit = submit
    async with api_client(controller) as client:
        post = asyncio.ensure_future(client.post("/v1/completions", json={
            "prompt": "Hi", "max_tokens": 4, "stream": True}))
        while not handles:
            await asyncio.sleep(0.01)
        handles[0].put(TokenOutput("r", ids[0]))
        resp = await asyncio.wait_for(post, 30)
        for i, token in enumerate(ids):
            if i:
                handles[0].put(TokenOutput("r", token, "length" if i == len(ids) - 1 else None))
            line = await asyncio.wait_for(resp.content.readline(), 30)
            assert json.loads(line[len(b"data: "):])["choices"][0]["text"] == \
                tokenizer.decode(ids[:i + 1])[len(tokenizer.decode(ids[:i])):]
            assert await resp.content.readline() == b"\n"
        assert await asyncio.wait_for(resp.content.read(), 30) == b"data: [DONE]\n\n"


# ---- the events' bytes -------------------------------------------------------------------

@pytest.mark.parametrize("chat", [False, True])
def test_events_have_openai_chunk_shapes(chat):
    builder = ResponseBuilder("cmpl-x" if not chat else "chatcmpl-x", "tiny", chat=chat)
    events, out = StreamEvents(builder), bytearray()
    logprobs = {"content": [{"token": "a", "logprob": 0.0, "bytes": [97], "top_logprobs": []}],
                "refusal": None}
    events.token(out, 0, "He", first=True)
    events.token(out, 1, "llo \"q\"\n", logprobs=logprobs)
    events.token(out, 0, "")
    events.token(out, 0, "!", finish_reason="stop")
    events.usage(out, 3, 4)
    events.error(out, "gone", 503, "instance_lost")
    raw = bytes(out)
    assert raw.count(b"\n\n") == 6 and raw.endswith(b"\n\n")
    parsed = [json.loads(e[len(b"data: "):]) for e in raw.split(b"\n\n")[:-1]]
    envelope = {"id": builder.id, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": builder.created, "model": "tiny"}

    def choice(index, text, finish=None, lp=None, first=False):
        if not chat:
            return {"index": index, "text": text, "logprobs": lp, "finish_reason": finish}
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        return {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}

    assert parsed[:4] == [{**envelope, "choices": [c]} for c in (
        choice(0, "He", first=True), choice(1, "llo \"q\"\n", lp=logprobs), choice(0, ""),
        choice(0, "!", "stop"))]
    assert parsed[4] == {**envelope, "choices": [], "usage": {
        "prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}
    assert parsed[5] == {"error": {"message": "gone", "type": "server_error", "param": None,
                                   "code": "instance_lost"}}


@settings(max_examples=examples(300), deadline=None)
@given(chat=st.booleans(), index=st.integers(0, 12), text=st.text(),
       finish=st.sampled_from([None, "length", "stop"]), first=st.booleans(),
       logprobs=st.sampled_from([None, {"content": [], "refusal": None}]))
def test_every_event_is_the_whole_chunk_encoded(chat, index, text, finish, first, logprobs):
    """Whether only its text is encoded (a plain chunk) or all of it, an event's bytes are
    those of the OpenAI chunk encoded whole -- any text: quotes, controls, non-ASCII."""
    builder = ResponseBuilder("chatcmpl-x" if chat else "cmpl-x", "tiny", chat=chat)
    events, out = StreamEvents(builder), bytearray()
    events.token(out, index, text, finish, first, logprobs)
    if chat:
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        assert delta  # never an empty delta, even for a token with no text yet
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    else:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
    chunk = {"id": builder.id, "object": "chat.completion.chunk" if chat else "text_completion",
             "created": builder.created, "model": "tiny", "choices": [choice]}
    assert bytes(out) == b"data: " + msgspec.json.encode(chunk) + b"\n\n"
    assert json.loads(bytes(out)[len(b"data: "):]) == chunk


# ---- the handle and the metrics ------------------------------------------------------------

async def test_take_returns_everything_queued_and_a_shared_event_wakes():
    handles = [RequestHandle(f"r{i}", lambda h, o: None) for i in range(2)]
    ready = asyncio.Event()
    handles[0].put(TokenOutput("r0", 1))
    for handle in handles:
        handle.listen(ready)
    assert ready.is_set()
    ready.clear()
    handles[1].put(TokenOutput("r1", 2))
    handles[1].put(TokenOutput("r1", 3, "length"))
    handles[1].put(TokenOutput("r1", 4))  # after its last: dropped
    assert ready.is_set()
    assert [o.token_id for o in handles[0].take()] == [1]
    assert [o.token_id for o in handles[1].take()] == [2, 3]
    assert list(handles[1].take()) == []


def test_only_a_request_the_core_has_not_settled_is_reported_as_left():
    """A stream the core ended (its Settle came) tells it nothing when it closes; one the
    client leaves early, or stops at a stop string, does -- with why."""
    left: list[tuple[str, Outcome]] = []
    on_close = lambda h, outcome: left.append((h.request_id, outcome))  # noqa: E731
    finished, early, stopped = (RequestHandle(r, on_close) for r in ("finished", "early", "stopped"))
    finished.put(TokenOutput("finished", 1, "length"))
    finished.settled = Settle("finished", Outcome.COMPLETED)
    early.put(TokenOutput("early", 1))
    for handle, outcome in ((finished, Outcome.CANCELLED), (early, Outcome.CANCELLED),
                            (stopped, Outcome.COMPLETED)):
        handle.close(outcome)
        handle.close(outcome)  # a second close says nothing more
    assert left == [("early", Outcome.CANCELLED), ("stopped", Outcome.COMPLETED)]


def test_batch_histogram_exposes_what_a_histogram_would():
    values = [0.0, 0.005, 0.0051, 0.2, 0.25, 3.0, 61.0, 1e-9, 0.1]
    reference = CollectorRegistry()
    histogram = Histogram("h_seconds", "doc", buckets=LATENCY_BUCKETS, registry=reference)
    for value in values:
        histogram.observe(value)
    batched = CollectorRegistry()
    BatchHistogram("h_seconds", "doc", LATENCY_BUCKETS, registry=batched).observe_many(values)

    def samples(registry):
        return [(s.name, s.labels, s.value) for m in registry.collect() for s in m.samples
                if not s.name.endswith("_created")]

    assert samples(batched) == samples(reference)
    assert [m.name for m in batched.collect()] == [m.name for m in reference.collect()]
    assert batched.get_sample_value("h_seconds_created") is not None


def test_tokens_are_counted_a_step_at_a_time():
    metrics = Metrics()
    metrics.observe_tokens(Tokens(StepTokens(["a", "b", "c"], [1, 2, 2]), ttfts={0: 0.3},
                                  tbts=[0.02, 0.004]))
    metrics.observe(Tokens(StepTokens(["b"], [3]), tbts=[0.5]))
    value = metrics.registry.get_sample_value
    assert value("ascendra_output_tokens_total") == 4
    assert value("ascendra_ttft_seconds_count") == 1
    assert value("ascendra_tbt_seconds_count") == 3
    assert value("ascendra_tbt_seconds_bucket", {"le": "0.005"}) == 1
    assert value("ascendra_tbt_seconds_bucket", {"le": "0.025"}) == 2
    assert value("ascendra_tbt_seconds_sum") == pytest.approx(0.524)
