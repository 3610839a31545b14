"""OpenAI API breadth, in-process over the fake controller (tests/api_fakes.py): n > 1 and
batched prompts fanned out to one engine request per choice and merged, echo, the
log-probability shapes, sampling fields reaching SamplingParams, fields accepted because
they do not change the answer, max_tokens clipped to the context, GET /v1/models/{id}.
What is refused (400 naming the field) is in test_api_input.py; the real daemon with the
official client in test_daemon_api.py.

Covers: daemon/api.py, daemon/response_streamer.py, daemon/logprobs.py.
"""
from __future__ import annotations

import json

import pytest

from daemon.errors import ApiError
from tests.api_fakes import CHAT, LIMITS, MAX_MODEL_LEN, FakeController, api_client
from tests.api_fakes import assert_openai_error, call


async def post(client, path: str, body: dict) -> dict:
    resp, raw = await call(client, "POST", path, body)
    assert resp.status == 200, raw
    return json.loads(raw)


async def post_stream(client, path: str, body: dict) -> list[dict]:
    resp, raw = await call(client, "POST", path, {**body, "stream": True})
    assert resp.status == 200, raw
    events = [line[len("data: "):] for line in raw.decode().split("\n\n") if line]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


# ---- n > 1 and batches of prompts -----------------------------------------------------------

async def test_n_fans_out_to_requests_with_their_own_ids_and_seeds(client, controller):
    body = await post(client, "/v1/completions", {"prompt": "Hi", "n": 3, "seed": 7,
                                                   "max_tokens": 2})
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["text"] == "aa" and c["finish_reason"] == "length" for c in body["choices"])
    assert [s.seed for _, s in controller.submitted] == [7, 8, 9]
    assert controller.request_ids == [f"{body['id']}-{i}" for i in range(3)]
    prompt_len = len(controller.submitted[0][0])
    assert body["usage"] == {"prompt_tokens": prompt_len, "completion_tokens": 6,
                             "total_tokens": prompt_len + 6,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert controller.open == {}  # every choice's handle is closed


async def test_a_single_choice_keeps_the_response_id_and_an_unseeded_n_stays_unseeded(client, controller):
    body = await post(client, "/v1/completions", {"prompt": "Hi", "max_tokens": 1})
    assert controller.request_ids == [body["id"]]
    await post(client, "/v1/chat/completions", {"messages": CHAT, "n": 2, "max_tokens": 1})
    assert [s.seed for _, s in controller.submitted[1:]] == [None, None]


async def test_n_seeds_wrap_within_int64(client, controller):
    await post(client, "/v1/completions", {"prompt": "Hi", "n": 2, "seed": 2**63 - 1,
                                           "max_tokens": 1})
    assert [s.seed for _, s in controller.submitted] == [2**63 - 1, -(2**63)]


@pytest.mark.parametrize("prompt", [["Hi", "Hello there"], [[5, 6], [7, 8, 9]]],
                         ids=["texts", "token ids"])
async def test_a_batch_of_prompts_gets_choices_prompt_by_prompt(client, controller, prompt):
    body = await post(client, "/v1/completions", {"prompt": prompt, "n": 2, "max_tokens": 3})
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    prompts = [ids for ids, _ in controller.submitted]
    assert prompts[0] == prompts[1] != prompts[2] == prompts[3]
    assert body["usage"]["prompt_tokens"] == len(prompts[0]) + len(prompts[2])  # once per prompt
    assert body["usage"]["completion_tokens"] == 12


async def test_a_refused_choice_cancels_those_already_accepted(client, controller):
    submit = controller.submit

    async def third_refused(prompt_token_ids, sampling, **kw):
        if len(controller.submitted) == 2:
            raise ApiError(503, "queue full", "queue_full")
        return await submit(prompt_token_ids, sampling, **kw)

    controller.submit = third_refused
    resp, raw = await call(client, "POST", "/v1/completions", {"prompt": "Hi", "n": 4})
    assert resp.status == 503 and json.loads(raw)["error"]["code"] == "queue_full"
    assert len(controller.submitted) == 2 and controller.open == {}


@pytest.mark.parametrize("path,body", [("/v1/completions", {"prompt": ["Hi", "Yo"]}),
                                       ("/v1/chat/completions", {"messages": CHAT, "n": 2})])
async def test_streamed_choices_carry_their_index(client, controller, path, body):
    chunks = await post_stream(client, path, {**body, "max_tokens": 3,
                                              "stream_options": {"include_usage": True}})
    *content, last = chunks
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6
    assert len({c["id"] for c in chunks}) == 1
    for index in (0, 1):
        mine = [c["choices"][0] for c in content if c["choices"][0]["index"] == index]
        assert len(mine) == 3  # one chunk per token
        assert [m["finish_reason"] for m in mine] == [None, None, "length"]
        if path.endswith("chat/completions"):
            assert mine[0]["delta"]["role"] == "assistant"
            assert all("role" not in m["delta"] for m in mine[1:])
            assert "".join(m["delta"].get("content", "") for m in mine) == "aaa"
        else:
            assert "".join(m["text"] for m in mine) == "aaa"
    assert controller.open == {}


# ---- echo -----------------------------------------------------------------------------------

async def test_echo_puts_the_prompt_before_the_text(client, tokenizer):
    body = await post(client, "/v1/completions", {"prompt": "Hi there", "echo": True,
                                                   "max_tokens": 2})
    assert body["choices"][0]["text"] == "Hi thereaa"
    ids = tokenizer.encode("Hello", add_bos=False)
    body = await post(client, "/v1/completions", {"prompt": ids, "echo": True, "max_tokens": 1})
    assert body["choices"][0]["text"] == "Helloa"
    chunks = await post_stream(client, "/v1/completions", {"prompt": "Hi", "echo": True,
                                                            "max_tokens": 2})
    assert [c["choices"][0]["text"] for c in chunks] == ["Hia", "a"]


# ---- log-probabilities ----------------------------------------------------------------------

async def test_completion_logprobs_in_the_legacy_shape(client, controller):
    body = await post(client, "/v1/completions", {"prompt": "Hi", "logprobs": 2, "max_tokens": 3})
    assert controller.submitted[0][1].logprobs == 2
    logprobs = body["choices"][0]["logprobs"]
    assert set(logprobs) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert logprobs["tokens"] == ["a"] * 3 and logprobs["token_logprobs"] == [0.0] * 3
    assert logprobs["text_offset"] == [0, 1, 2]
    assert all(len(top) == 2 and top["a"] == 0.0 for top in logprobs["top_logprobs"])
    # streamed: each chunk has its token's part, offsets continue
    chunks = await post_stream(client, "/v1/completions", {"prompt": "Hi", "logprobs": 0,
                                                            "max_tokens": 3})
    parts = [c["choices"][0]["logprobs"] for c in chunks]
    assert [p["text_offset"] for p in parts] == [[0], [1], [2]]
    assert all(p["tokens"] == ["a"] and p["top_logprobs"] == [{"a": 0.0}] for p in parts)
    plain = await post(client, "/v1/completions", {"prompt": "Hi", "max_tokens": 1})
    assert plain["choices"][0]["logprobs"] is None


async def test_chat_logprobs_in_the_chat_shape(client, controller):
    body = await post(client, "/v1/chat/completions", {"messages": CHAT, "logprobs": True,
                                                        "top_logprobs": 2, "max_tokens": 2})
    assert controller.submitted[0][1].logprobs == 2
    logprobs = body["choices"][0]["logprobs"]
    assert logprobs["refusal"] is None and len(logprobs["content"]) == 2
    for entry in logprobs["content"]:
        assert (entry["token"], entry["logprob"], entry["bytes"]) == ("a", 0.0, [ord("a")])
        assert len(entry["top_logprobs"]) == 2
        assert set(entry["top_logprobs"][0]) == {"token", "logprob", "bytes"}
    await post(client, "/v1/chat/completions", {"messages": CHAT, "logprobs": True,
                                                "max_tokens": 1})
    assert controller.submitted[1][1].logprobs == 0
    chunks = await post_stream(client, "/v1/chat/completions", {"messages": CHAT,
                                                                 "logprobs": True, "max_tokens": 2})
    assert [len(c["choices"][0]["logprobs"]["content"]) for c in chunks] == [1, 1]
    body = await post(client, "/v1/chat/completions", {"messages": CHAT, "logprobs": False,
                                                        "max_tokens": 1})
    assert body["choices"][0]["logprobs"] is None and controller.submitted[-1][1].logprobs is None


def test_token_text_of_a_partial_character_names_its_bytes(tokenizer):
    from daemon.logprobs import TokenText
    text = TokenText(tokenizer)
    ids = tokenizer.encode("é", add_bos=False)
    assert len(ids) == 2  # one byte token each
    assert [text.text(i) for i in ids] == ["bytes:\\xc3", "bytes:\\xa9"]
    assert [text.bytes(i) for i in ids] == [[0xC3], [0xA9]]


# ---- sampling fields and accepted fields ----------------------------------------------------

async def test_sampling_fields_reach_the_engine(client, controller, tokenizer):
    await post(client, "/v1/completions", {"prompt": "Hi", "presence_penalty": 1.5,
                                           "frequency_penalty": -0.5, "max_tokens": 1,
                                           "logit_bias": {"5": -100, "1023": 2.5}})
    sampling = controller.submitted[0][1]
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (1.5, -0.5)
    assert sampling.logit_bias == {5: -100.0, 1023: 2.5}


@pytest.mark.parametrize("path,extra", [
    ("/v1/completions", {"user": "u1", "best_of": 2, "n": 2, "suffix": "",
                         "response_format": {"type": "text"}, "logprobs": None}),
    ("/v1/chat/completions", {"user": "u1", "tools": [], "tool_choice": "auto",
                              "parallel_tool_calls": True, "store": False,
                              "metadata": {"k": "v"}, "service_tier": "auto",
                              "prediction": {"type": "content", "content": "x"},
                              "modalities": ["text"], "response_format": {"type": "text"},
                              "safety_identifier": "s", "prompt_cache_key": "c",
                              "function_call": "none", "top_logprobs": None}),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}],
                              "tool_choice": "none"}),
    ("/v1/completions", {"some_future_field": {"x": 1}, "min_p": 0, "repetition_penalty": 1.0,
                         "skip_special_tokens": True}),
    ("/v1/chat/completions", {"stream_options": {"include_usage": False, "include_obfuscation": True},
                              "echo": False, "add_generation_prompt": True}),
], ids=["completion fields", "chat fields", "tools never called", "unknown and neutral",
        "neutral chat extras"])
async def test_fields_that_do_not_change_the_answer_are_accepted(client, path, extra):
    body = {"prompt": "Hi"} if path == "/v1/completions" else {"messages": CHAT}
    await post(client, path, {**body, "max_tokens": 1, **extra})


async def test_unknown_fields_are_logged_once(client, caplog):
    for _ in range(2):
        await post(client, "/v1/completions", {"prompt": "Hi", "max_tokens": 1, "frobnicate": 1})
    assert sum("frobnicate" in r.getMessage() for r in caplog.records) == 1


# ---- context and max_tokens -----------------------------------------------------------------

async def test_unset_max_tokens_is_clipped_to_what_fits(client, controller):
    await post(client, "/v1/completions", {"prompt": [5] * (MAX_MODEL_LEN - 2)})
    await post(client, "/v1/completions", {"prompt": [5] * 10})
    assert [s.max_tokens for _, s in controller.submitted] == [2, LIMITS["default_max_tokens"]]


async def test_max_tokens_that_just_fits_is_served(client, controller):
    await post(client, "/v1/completions", {"prompt": [5] * (MAX_MODEL_LEN - 8), "max_tokens": 8})
    resp, raw = await call(client, "POST", "/v1/completions",
                           {"prompt": [5] * (MAX_MODEL_LEN - 8), "max_tokens": 9})
    assert resp.status == 400
    assert_openai_error(json.loads(raw), 400, f"maximum context length is {MAX_MODEL_LEN}",
                        param="max_tokens")


# ---- models ---------------------------------------------------------------------------------

async def test_get_one_model_by_id(client):
    resp, raw = await call(client, "GET", "/v1/models/tiny")
    assert resp.status == 200
    assert json.loads(raw) == {"id": "tiny", "object": "model", "created": 0,
                               "owned_by": "ascendra", "max_model_len": MAX_MODEL_LEN}
    resp, raw = await call(client, "GET", "/v1/models/gpt-4o")
    assert resp.status == 404
    error = assert_openai_error(json.loads(raw), 404, "gpt-4o", param="model")
    assert error["code"] == "model_not_found"


async def test_a_model_name_with_a_slash_is_found(tokenizer):
    controller = FakeController(tokenizer, model_name="org/tiny-model")
    async with api_client(controller, **LIMITS) as client:
        resp, raw = await call(client, "GET", "/v1/models/org/tiny-model")
        assert resp.status == 200 and json.loads(raw)["id"] == "org/tiny-model"


async def test_a_client_leaving_mid_stream_cancels_every_choice(client, controller):
    import asyncio

    from daemon.request_handle import RequestHandle
    from ipc.messages import TokenOutput
    outcomes = []

    async def one_token_then_silence(prompt_token_ids, sampling, *, request_id, **_):
        handle = RequestHandle(request_id, lambda h, outcome: outcomes.append(outcome))
        asyncio.get_running_loop().call_soon(handle.put, TokenOutput(request_id, 5))
        return handle

    controller.submit = one_token_then_silence
    resp = await client.post("/v1/completions", json={"prompt": "Hi", "n": 3, "stream": True})
    assert resp.status == 200
    assert (await resp.content.readline()).startswith(b"data: ")
    resp.close()  # leave while every choice still runs
    for _ in range(100):
        if len(outcomes) == 3:
            break
        await asyncio.sleep(0.02)
    assert [o.value for o in outcomes] == ["cancelled"] * 3
