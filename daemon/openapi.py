"""The OpenAPI 3.1 description of the HTTP API, served at `GET /openapi.json`.

The request bodies are generated from the msgspec structs the handlers decode
(`msgspec.json.schema_components`), so the description cannot drift from the
validation. What only the running server knows is filled in per server: the model
name (any other is a 404), the `max_tokens` limit, the vocabulary (token-id prompts)
and the context length. A body that fits this description is served, or refused for a
reason the schema cannot express: a text prompt (or chat) longer than the context, a
chat the model's template refuses, an integer written as a float (`1.0` is a JSON Schema
integer; the decoder is strict), an overloaded server. One that does not fit gets a 4xx
in OpenAI's error shape.
"""
from __future__ import annotations

import copy
import functools

import msgspec

from daemon.openai_schema import ChatCompletionRequest, CompletionRequest

_REF = "#/components/schemas/{name}"

ERROR_SCHEMA = {
    "title": "Error",
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {
            "message": {"type": "string"},
            "type": {"type": "string", "enum": ["invalid_request_error", "authentication_error",
                                                "server_error"]},
            "param": {"type": ["string", "null"]},
            "code": {"type": ["string", "null"]},
        },
    }},
}

_ERRORS = {
    "400": "invalid body or parameter; the message names the field",
    "401": "missing or wrong API key",
    "404": "the model is not served here",
    "413": "the body is over the size limit",
    "415": "the body is not JSON",
    "503": "no instance can take the request now, or it was dropped under overload",
}


@functools.cache
def _components() -> dict:
    _, components = msgspec.json.schema_components(
        [CompletionRequest, ChatCompletionRequest], ref_template=_REF)
    return components


def _branch(prop: dict, kind: str) -> dict:
    """The `type: kind` alternative of an `anyOf` property (or the property itself)."""
    for alternative in prop.get("anyOf", [prop]):
        if alternative.get("type") == kind:
            return alternative
    raise KeyError(kind)


def _server_limits(components: dict, model_name: str | None, max_tokens_limit: int | None,
                   vocab_size: int | None, max_model_len: int | None) -> None:
    """Narrow the generated schemas to what this server accepts."""
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        props = components[name]["properties"]
        if model_name:
            props["model"] = {"anyOf": [{"type": "string", "enum": [model_name]}, {"type": "null"}],
                              "default": None, "description": "the served model (GET /v1/models)"}
        if max_tokens_limit:
            for field in ("max_tokens", "max_completion_tokens"):
                if field in props:
                    _branch(props[field], "integer")["maximum"] = max_tokens_limit
        # Accepted for compatibility, only at their defaults.
        props["n"] = {"type": "integer", "enum": [1], "default": 1}
        for field in ("presence_penalty", "frequency_penalty"):
            props[field] = {"type": "number", "enum": [0], "default": 0}
    completion = components["CompletionRequest"]["properties"]
    completion["echo"] = {"type": "boolean", "enum": [False], "default": False}
    ids = _branch(completion["prompt"], "array")
    ids["minItems"] = 1
    if vocab_size:
        ids["items"] = {"type": "integer", "minimum": 0, "maximum": vocab_size - 1}
    if max_model_len:
        ids["maxItems"] = max_model_len - 1


def _operation(summary: str, body_schema: str | None = None, ok: dict | None = None,
               secured: bool = False, errors: tuple[str, ...] = ()) -> dict:
    op: dict = {"summary": summary,
                "responses": {"200": ok or {"description": "OK"}}}
    if body_schema:
        op["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": {"$ref": _REF.format(name=body_schema)}}}}
    if secured:
        op["security"] = [{"bearer": []}]
        errors = ("401", *errors)
    for status in errors:
        op["responses"][status] = {"description": _ERRORS[status], "content": {
            "application/json": {"schema": {"$ref": _REF.format(name="Error")}}}}
    return op


def build_openapi(*, model_name: str | None = None, max_tokens_limit: int | None = None,
                  vocab_size: int | None = None, max_model_len: int | None = None,
                  api_key_required: bool = False) -> dict:
    """The OpenAPI 3.1 document; the keyword arguments narrow it to one server."""
    components = copy.deepcopy(_components())
    _server_limits(components, model_name, max_tokens_limit, vocab_size, max_model_len)
    components["Error"] = ERROR_SCHEMA
    generated = {"description": "a completion (JSON), or with `stream` server-sent events "
                                "ending in `data: [DONE]`",
                 "content": {"application/json": {"schema": {"type": "object"}},
                             "text/event-stream": {"schema": {"type": "string"}}}}
    body_errors = ("400", "404", "413", "415", "503")
    state = {"application/json": {"schema": {"type": "object"}}}
    health = _operation("Every instance's state (no API key needed)",
                        ok={"description": "serving", "content": state})
    health["responses"]["503"] = {"description": "starting, degraded or draining",
                                  "content": state}
    spec = {
        "openapi": "3.1.0",
        "info": {"title": "Ascendra", "version": "1",
                 "description": "OpenAI-compatible completions and chat completions. Every "
                                "error is JSON in OpenAI's error shape."},
        "paths": {
            "/v1/completions": {"post": _operation(
                "Text completion", "CompletionRequest", generated, api_key_required, body_errors)},
            "/v1/chat/completions": {"post": _operation(
                "Chat completion", "ChatCompletionRequest", generated, api_key_required,
                body_errors)},
            "/v1/models": {"get": _operation(
                "The served model", ok={"description": "a list with the one served model",
                                        "content": {"application/json": {"schema": {
                                            "type": "object"}}}},
                secured=api_key_required)},
            "/health": {"get": health},
            "/metrics": {"get": _operation(
                "Prometheus metrics (no API key needed)",
                ok={"description": "Prometheus text format", "content": {
                    "text/plain": {"schema": {"type": "string"}}}})},
            "/openapi.json": {"get": _operation(
                "This description (no API key needed)",
                ok={"description": "OpenAPI 3.1", "content": {"application/json": {
                    "schema": {"type": "object"}}}})},
        },
        "components": {"schemas": components},
    }
    if api_key_required:
        spec["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return spec
