"""The HTTP edge beyond the fields: body size (413), content types (415), routes (404) and
methods (405), failures inside (a JSON 500 without details), chat templates that refuse,
and the OpenAPI description -- every answer JSON in OpenAI's error shape. In-process over
the fake controller (tests/api_fakes.py); the fields of a body are in test_api_input.py.

Covers: daemon/api.py, daemon/http_guard.py, daemon/openapi.py.
"""
from __future__ import annotations

import json

import pytest

from daemon.config import ServeConfig
from tests.api_fakes import (
    CHAT, HI, LIMITS, MAX_BODY, MAX_TOKENS_LIMIT, api_client, assert_openai_error, call,
    expect_error,
)


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

@pytest.mark.slow
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

    from daemon.openai_fields import CHAT_FOREIGN_FIELDS, FOREIGN_FIELDS
    from daemon.openai_schema import ChatCompletionRequest, CompletionRequest
    from daemon.openapi import build_openapi
    spec = build_openapi()
    for struct, foreign in ((CompletionRequest, FOREIGN_FIELDS),
                            (ChatCompletionRequest, {**FOREIGN_FIELDS, **CHAT_FOREIGN_FIELDS})):
        props = spec["components"]["schemas"][struct.__name__]["properties"]
        # the struct's fields, and other servers' extensions at the values that are served
        assert set(props) == set(struct.__struct_fields__) | set(foreign)
        for name in set(foreign) - set(struct.__struct_fields__):
            assert "served only at this value" in props[name]["description"]
        assert props["temperature"] == msgspec.json.schema(struct)["$defs"][struct.__name__][
            "properties"]["temperature"]


def test_limits_are_config_fields_with_safe_defaults():
    config = ServeConfig().http
    assert config.max_body_bytes == 1 << 20
    assert config.max_tokens_limit == 4096 and config.default_max_tokens <= config.max_tokens_limit
