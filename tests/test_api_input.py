"""Bad input at the HTTP edge: every error is JSON in OpenAI's error shape and names the
field (message and `param`); oversize bodies get 413, prompts longer than the context a
400 that states the limit, invalid values 400, non-JSON bodies 415, unknown routes 404
and wrong methods 405 -- all JSON. The app runs in-process over a fake controller
(tests/api_fakes.py); the real daemon's answers are fuzzed in test_api_fuzz.py."""
from __future__ import annotations

import json

import pytest

from daemon.config import ServeConfig
from tests.api_fakes import FakeController, api_client

MAX_MODEL_LEN = 64
MAX_TOKENS_LIMIT = 32
MAX_BODY = 4096
LIMITS = dict(max_tokens_limit=MAX_TOKENS_LIMIT, default_max_tokens=4, max_body_bytes=MAX_BODY)
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tokenizer(tiny_models):
    from engines.models.tokenizer import Tokenizer
    return Tokenizer(tiny_models["llama"])


@pytest.fixture
def controller(tokenizer):
    return FakeController(tokenizer, max_model_len=MAX_MODEL_LEN)


@pytest.fixture
async def client(controller):
    async with api_client(controller, **LIMITS) as c:
        yield c


def assert_openai_error(body: dict, status: int, *words: str, param: str | None = None) -> dict:
    """`{"error": {"message", "type", "param", "code"}}` with every word in the message."""
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == ("authentication_error" if status == 401 else
                             "invalid_request_error" if status < 500 else "server_error")
    for word in words:
        assert word in error["message"], (word, error["message"])
    if param is not None:
        assert error["param"] == param, error
    return error


async def call(client, method: str, path: str, body=None, headers=None):
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    headers = {"Content-Type": "application/json", **(headers or {})} if body is not None else {}
    resp = await client.request(method, path, data=body, headers=headers)
    raw = await resp.read()
    return resp, raw


async def expect_error(client, method, path, body, status, *words, param=None, headers=None):
    resp, raw = await call(client, method, path, body, headers)
    assert resp.status == status, raw
    assert resp.content_type == "application/json", (resp.content_type, raw)
    return assert_openai_error(json.loads(raw), status, *words, param=param)


# ---- invalid bodies: 400 naming the field ---------------------------------------------------

HI = {"prompt": "Hi"}
COMPLETION_BAD = [
    # (id, body, words in the message, param)
    ("invalid JSON", b"{prompt: 1", ["JSON"], None),
    ("truncated JSON", b'{"prompt": "Hi"', ["JSON"], None),
    ("empty body", b"", ["JSON"], None),
    ("not UTF-8", b'{"prompt": "\xff\xfe"}', ["JSON"], None),
    ("array body", b"[1, 2]", ["object"], None),
    ("string body", b'"prompt"', ["object"], None),
    ("missing prompt", {"max_tokens": 4}, ["prompt"], "prompt"),
    ("prompt null", {"prompt": None}, ["prompt"], "prompt"),
    ("prompt a number", {"prompt": 5}, ["prompt"], "prompt"),
    ("prompt an object", {"prompt": {"text": "Hi"}}, ["prompt"], "prompt"),
    ("prompt mixed list", {"prompt": [1, "a"]}, ["prompt"], "prompt[1]"),
    ("empty token list", {"prompt": []}, ["prompt", "empty"], "prompt"),
    ("token id outside vocab", {"prompt": [1, 10**7]}, ["prompt", "vocabulary"], "prompt"),
    ("negative token id", {"prompt": [-1]}, ["prompt"], "prompt"),
    ("token id beyond int64", {"prompt": [2**70]}, ["prompt"], "prompt"),
    ("max_tokens a string", {**HI, "max_tokens": "many"}, ["max_tokens"], "max_tokens"),
    ("max_tokens a float", {**HI, "max_tokens": 1.5}, ["max_tokens"], "max_tokens"),
    ("max_tokens 0", {**HI, "max_tokens": 0}, ["max_tokens"], "max_tokens"),
    ("max_tokens negative", {**HI, "max_tokens": -5}, ["max_tokens"], "max_tokens"),
    ("max_tokens over the limit", {**HI, "max_tokens": MAX_TOKENS_LIMIT + 1},
     ["max_tokens", "limit", str(MAX_TOKENS_LIMIT)], "max_tokens"),
    ("max_tokens huge", {**HI, "max_tokens": 10**30}, ["max_tokens"], "max_tokens"),
    ("temperature a string", {**HI, "temperature": "hot"}, ["temperature"], "temperature"),
    ("temperature -1", {**HI, "temperature": -1}, ["temperature"], "temperature"),
    ("temperature 2.5", {**HI, "temperature": 2.5}, ["temperature"], "temperature"),
    ("temperature overflow", b'{"prompt": "Hi", "temperature": 1e400}', ["temperature"],
     "temperature"),
    ("top_p 0", {**HI, "top_p": 0}, ["top_p"], "top_p"),
    ("top_p 2", {**HI, "top_p": 2}, ["top_p"], "top_p"),
    ("top_p null", {**HI, "top_p": None}, ["top_p"], "top_p"),
    ("top_k -2", {**HI, "top_k": -2}, ["top_k"], "top_k"),
    ("top_k huge", {**HI, "top_k": 2**40}, ["top_k"], "top_k"),
    ("seed a string", {**HI, "seed": "7"}, ["seed"], "seed"),
    ("seed beyond int64", {**HI, "seed": 2**63}, ["seed"], "seed"),
    ("stream a string", {**HI, "stream": "yes"}, ["stream"], "stream"),
    ("stream_options wrong", {**HI, "stream": True, "stream_options": {"include_usage": 1}},
     ["stream_options.include_usage"], "stream_options.include_usage"),
    ("stop a number", {**HI, "stop": 3}, ["stop"], "stop"),
    ("stop empty string", {**HI, "stop": ""}, ["stop"], "stop"),
    ("stop with an empty string", {**HI, "stop": ["a", ""]}, ["stop"], "stop[1]"),
    ("five stops", {**HI, "stop": ["a", "b", "c", "d", "e"]}, ["stop"], "stop"),
    ("priority -1", {**HI, "priority": -1}, ["priority"], "priority"),
    ("priority 101", {**HI, "priority": 101}, ["priority"], "priority"),
    ("ttft_slo 0", {**HI, "ttft_slo": 0}, ["ttft_slo"], "ttft_slo"),
    ("ttft_slo negative", {**HI, "ttft_slo": -1.0}, ["ttft_slo"], "ttft_slo"),
    ("ttft_slo over a day", {**HI, "ttft_slo": 1e9}, ["ttft_slo"], "ttft_slo"),
    ("tbt_slo 0", {**HI, "tbt_slo": 0}, ["tbt_slo"], "tbt_slo"),
    ("ignore_eos a string", {**HI, "ignore_eos": "no"}, ["ignore_eos"], "ignore_eos"),
    ("n 2", {**HI, "n": 2}, ["n", "n=1"], "n"),
    ("n 0", {**HI, "n": 0}, ["n=1"], "n"),
    ("presence_penalty", {**HI, "presence_penalty": 0.5}, ["presence_penalty"],
     "presence_penalty"),
    ("frequency_penalty", {**HI, "frequency_penalty": -1}, ["frequency_penalty"],
     "frequency_penalty"),
    ("echo", {**HI, "echo": True}, ["echo"], "echo"),
    ("logprobs", {**HI, "logprobs": 5}, ["logprobs"], "logprobs"),
    ("model a number", {**HI, "model": 5}, ["model"], "model"),
    ("user a number", {**HI, "user": 5}, ["user"], "user"),
]


@pytest.mark.parametrize("body,words,param", [c[1:] for c in COMPLETION_BAD],
                         ids=[c[0] for c in COMPLETION_BAD])
async def test_invalid_completion_bodies_get_400_naming_the_field(client, controller, body,
                                                                 words, param):
    await expect_error(client, "POST", "/v1/completions", body, 400, *words, param=param)
    assert controller.submitted == []  # nothing invalid reaches the controller


MSG = [{"role": "user", "content": "hi"}]
CHAT_BAD = [
    ("missing messages", {"max_tokens": 4}, ["messages"], "messages"),
    ("messages null", {"messages": None}, ["messages"], "messages"),
    ("no messages", {"messages": []}, ["messages"], "messages"),
    ("messages an object", {"messages": {"role": "user"}}, ["messages"], "messages"),
    ("message a string", {"messages": ["hi"]}, ["messages[0]"], "messages[0]"),
    ("bad role", {"messages": [{"role": "wizard", "content": "hi"}]}, ["role"],
     "messages[0].role"),
    ("missing role", {"messages": [{"content": "hi"}]}, ["role"], "messages[0].role"),
    ("missing content", {"messages": [{"role": "user"}]}, ["content"], "messages[0].content"),
    ("content a number", {"messages": [{"role": "user", "content": 7}]}, ["content"],
     "messages[0].content"),
    ("image part", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, ["type"],
     "messages[0].content[0].type"),
    ("max_completion_tokens 0", {"messages": MSG, "max_completion_tokens": 0},
     ["max_completion_tokens"], "max_completion_tokens"),
    ("max_completion_tokens over the limit", {"messages": MSG, "max_completion_tokens": 10**6},
     ["max_tokens", "limit"], "max_tokens"),
    ("temperature -1", {"messages": MSG, "temperature": -1}, ["temperature"], "temperature"),
    ("top_p 2", {"messages": MSG, "top_p": 2}, ["top_p"], "top_p"),
]


@pytest.mark.parametrize("body,words,param", [c[1:] for c in CHAT_BAD],
                         ids=[c[0] for c in CHAT_BAD])
async def test_invalid_chat_bodies_get_400_naming_the_field(client, controller, body, words,
                                                           param):
    await expect_error(client, "POST", "/v1/chat/completions", body, 400, *words, param=param)
    assert controller.submitted == []


async def test_unknown_model_is_404_naming_it(client):
    error = await expect_error(client, "POST", "/v1/completions", {**HI, "model": "gpt-9"}, 404,
                               "model", "gpt-9", "tiny")
    assert error["code"] == "model_not_found"


async def test_valid_requests_at_the_limits_are_served(client, controller):
    resp, raw = await call(client, "POST", "/v1/completions",
                           {"prompt": [1] * (MAX_MODEL_LEN - 1), "max_tokens": MAX_TOKENS_LIMIT,
                            "temperature": 2, "top_p": 1, "top_k": -1, "seed": -(2**63),
                            "stop": ["x", "y", "z", "w"], "model": "tiny", "priority": 100,
                            "ttft_slo": 86400, "n": 1})
    assert resp.status == 200, raw
    assert json.loads(raw)["usage"]["completion_tokens"] == MAX_TOKENS_LIMIT
    resp, raw = await call(client, "POST", "/v1/chat/completions",
                           {"messages": CHAT, "max_completion_tokens": 3})
    assert resp.status == 200, raw
    assert controller.submitted[-1][1].max_tokens == 3


# ---- prompt length: 400 stating the limit ---------------------------------------------------

async def test_token_prompt_longer_than_the_context_states_the_limit(client):
    error = await expect_error(client, "POST", "/v1/completions", {"prompt": [1] * MAX_MODEL_LEN},
                               400, "prompt", str(MAX_MODEL_LEN), str(MAX_MODEL_LEN - 1),
                               param="prompt")
    assert "limit" in error["message"]


async def test_text_prompt_longer_than_the_context_states_the_limit(client):
    await expect_error(client, "POST", "/v1/completions", {"prompt": "word " * 400}, 400,
                       "prompt", "limit", f"context length {MAX_MODEL_LEN}", param="prompt")


async def test_chat_longer_than_the_context_names_messages_and_the_limit(client):
    await expect_error(client, "POST", "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "word " * 400}]}, 400,
                       "messages", "limit", f"context length {MAX_MODEL_LEN}", param="messages")


async def test_no_ready_instance_is_503_not_a_prompt_limit(client, controller):
    controller.max_model_len = 0  # e.g. the only instance is restarting
    error = await expect_error(client, "POST", "/v1/completions", HI, 503, "no instance")
    assert error["code"] == "unavailable"


# ---- body size: 413 -------------------------------------------------------------------------

async def test_body_over_the_limit_is_413_stating_it(client, controller):
    body = json.dumps({"prompt": "x" * MAX_BODY})
    error = await expect_error(client, "POST", "/v1/completions", body, 413, "limit",
                               str(MAX_BODY))
    assert error["code"] == "body_too_large"
    assert controller.submitted == []


async def test_chunked_body_over_the_limit_is_413(client):
    async def chunks():  # no Content-Length: the limit holds while reading
        for _ in range(8):
            yield b"x" * 1024

    resp = await client.post("/v1/chat/completions", data=chunks(),
                             headers={"Content-Type": "application/json"})
    assert resp.status == 413
    assert_openai_error(await resp.json(), 413, "limit")


async def test_body_just_under_the_limit_is_read(client):
    body = json.dumps({"prompt": "Hi", "user": "u" * (MAX_BODY - 40)})
    assert len(body) <= MAX_BODY
    resp, raw = await call(client, "POST", "/v1/completions", body)
    assert resp.status == 200, raw


# ---- content types: JSON only ---------------------------------------------------------------

@pytest.mark.parametrize("content_type", ["text/xml", "application/xml",
                                          "multipart/form-data; boundary=x", "image/png",
                                          "application/msgpack"])
async def test_non_json_content_types_get_415(client, content_type):
    error = await expect_error(client, "POST", "/v1/completions", json.dumps(HI), 415,
                               "Content-Type", "application/json",
                               headers={"Content-Type": content_type})
    assert error["code"] == "unsupported_media_type"


@pytest.mark.parametrize("content_type", [None, "application/json",
                                          "application/json; charset=utf-8",
                                          "application/x-www-form-urlencoded",  # curl -d
                                          "text/plain;charset=UTF-8",  # fetch() with a string
                                          "application/octet-stream",  # raw bytes
                                          "application/merge-patch+json"])
async def test_json_content_types_are_read(client, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    resp = await client.post("/v1/completions", data=json.dumps(HI).encode(), headers=headers,
                             skip_auto_headers=["Content-Type"])
    assert resp.status == 200, await resp.text()


# ---- routes and methods ---------------------------------------------------------------------

@pytest.mark.parametrize("method,path", [("GET", "/nothing"), ("GET", "/v1/nothing"),
                                         ("POST", "/v1/completions/x"), ("GET", "/v2/models")])
async def test_unknown_routes_are_json_404(client, method, path):
    error = await expect_error(client, method, path, None, 404, path)
    assert error["code"] == "not_found"


@pytest.mark.parametrize("method,path,allowed", [("GET", "/v1/completions", "POST"),
                                                 ("PUT", "/v1/chat/completions", "POST"),
                                                 ("POST", "/v1/models", "GET"),
                                                 ("DELETE", "/health", "GET")])
async def test_wrong_methods_are_json_405_with_allow(client, method, path, allowed):
    resp, raw = await call(client, method, path)
    assert resp.status == 405
    assert allowed in resp.headers["Allow"]
    assert_openai_error(json.loads(raw), 405, method, allowed)


# ---- failures inside ------------------------------------------------------------------------

async def test_an_unexpected_error_is_a_json_500_without_details(client, controller):
    controller.fail_with = RuntimeError("secret internals")
    error = await expect_error(client, "POST", "/v1/completions", HI, 500, "internal")
    assert "secret" not in error["message"]
    controller.fail_with = None
    assert (await call(client, "POST", "/v1/completions", HI))[0].status == 200  # still serving


async def test_a_chat_template_that_refuses_the_messages_is_a_400(controller):
    import jinja2

    class Refusing:
        vocab_size = controller.tokenizer.vocab_size

        def apply_chat_template(self, messages):
            raise jinja2.exceptions.TemplateError("Conversation roles must alternate")

    controller.tokenizer = Refusing()
    async with api_client(controller, **LIMITS) as client:
        await expect_error(client, "POST", "/v1/chat/completions", {"messages": CHAT}, 400,
                           "messages", "alternate", param="messages")


async def test_a_model_without_a_chat_template_is_a_400(controller, tokenizer):
    import copy
    plain = copy.copy(tokenizer)
    plain.chat_template = None
    controller.tokenizer = plain
    async with api_client(controller, **LIMITS) as client:
        await expect_error(client, "POST", "/v1/chat/completions", {"messages": CHAT}, 400,
                           "messages", "chat_template", param="messages")


# ---- the OpenAPI description ----------------------------------------------------------------

async def test_openapi_description_is_served_and_valid(client):
    resp = await client.get("/openapi.json")
    assert resp.status == 200
    spec = await resp.json()
    assert spec["openapi"].startswith("3.1")
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics",
            "/openapi.json"} <= set(spec["paths"])
    body = spec["components"]["schemas"]["CompletionRequest"]
    assert "prompt" in body["required"]
    # Narrowed to this server: its model and its max_tokens limit.
    assert {"type": "string", "enum": ["tiny"]} in body["properties"]["model"]["anyOf"]
    assert {"type": "integer", "minimum": 1, "maximum": MAX_TOKENS_LIMIT} in \
        body["properties"]["max_tokens"]["anyOf"]
    schemathesis = pytest.importorskip("schemathesis")
    schemathesis.openapi.from_dict(spec).validate()  # against the OpenAPI 3.1 meta-schema


def test_openapi_request_schemas_come_from_the_msgspec_structs():
    import msgspec

    from daemon.openai_schema import ChatCompletionRequest, CompletionRequest
    from daemon.openapi import build_openapi
    spec = build_openapi()
    for struct in (CompletionRequest, ChatCompletionRequest):
        props = spec["components"]["schemas"][struct.__name__]["properties"]
        assert set(props) == set(struct.__struct_fields__)
        assert props["temperature"] == msgspec.json.schema(struct)["$defs"][struct.__name__][
            "properties"]["temperature"]


def test_limits_are_config_fields_with_safe_defaults():
    config = ServeConfig()
    assert config.max_body_bytes == 1 << 20
    assert config.max_tokens_limit == 4096 and config.default_max_tokens <= config.max_tokens_limit
