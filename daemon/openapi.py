"""The OpenAPI 3.1 description of the HTTP API, served at `GET /openapi.json`.

The request bodies are generated from the msgspec structs the handlers decode
(`msgspec.json.schema_components`), so the description cannot drift from the
validation. What only the running server knows is filled in per server: the model
name (any other is a 404), the `max_tokens` limit, the vocabulary (token-id prompts)
and the context length. A body that fits this description is served, or refused for a
reason the schema cannot express: a text prompt (or chat) longer than the context, or
one with `max_tokens` that does not fit beside it (the schema bounds each alone), more
than MAX_CHOICES choices (n x prompts), a chat the model's template refuses, an integer
written as a float (`1.0` is a JSON Schema integer; the decoder is strict), an
overloaded server. Fields served only when unused (functions, audio, ...) show the
values that are served; those whose served values no schema bounds -- a JSON schema, regex
or tool that must compile (docs/api.md#structured-outputs-and-tools) -- show a subset. One that does not fit gets a 4xx in OpenAI's error shape (or is
served: the description is at most as wide as the server).
"""
from __future__ import annotations

import copy
import functools

import msgspec

from daemon.openai_fields import CHAT_FOREIGN_FIELDS, FOREIGN_FIELDS
from daemon.openai_schema import (
    MAX_CHOICES, ChatCompletionRequest, CompletionRequest, TokenizeRequest, TokenizeResponse,
)
from daemon.slo_headers import TPOT_HEADER, TTFT_HEADER

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
        [CompletionRequest, ChatCompletionRequest, TokenizeRequest, TokenizeResponse],
        ref_template=_REF)
    return components


def _branch(prop: dict, kind: str) -> dict:
    """The `type: kind` alternative of an `anyOf` property (or the property itself)."""
    for alternative in prop.get("anyOf", [prop]):
        if alternative.get("type") == kind:
            return alternative
    raise KeyError(kind)


_NULL = {"type": "null"}
#: Declared for compatibility, served only when unused (daemon/openai_fields.py): the schema
#: shows the values that are served. Grammars and tools are served, but whether one
#: compiles no schema says: these show a subset that always does.
_UNUSED_ONLY = {
    "suffix": {"anyOf": [{"type": "string", "maxLength": 0}, _NULL], "default": None},
    "best_of": {"type": "null", "default": None, "description": "null, or equal to n"},
    "response_format": {"anyOf": [{"type": "object", "required": ["type"], "properties": {
        "type": {"enum": ["text", "json_object"]}}}, _NULL], "default": None,
        "description": "also json_schema with a schema that compiles"},
    "tools": {"anyOf": [{"type": "array", "maxItems": 0}, _NULL], "default": None,
              "description": "functions whose parameters schemas compile"},
    "tool_choice": {"enum": ["none", "auto", None], "default": None,
                    "description": "also required, or a function of tools"},
    **{field: {"type": "null", "default": None,
               "description": "a JSON schema / regex / choices that compile"}
       for field in ("guided_json", "guided_regex", "guided_choice", "structured_outputs")},
    "functions": {"anyOf": [{"type": "array", "maxItems": 0}, _NULL], "default": None},
    "function_call": {"enum": ["none", "auto", None], "default": None},
    "modalities": {"anyOf": [{"type": "array", "items": {"enum": ["text"]}}, _NULL],
                   "default": None},
    **{field: {"type": "null", "default": None}
       for field in ("audio", "reasoning_effort", "verbosity", "web_search_options")},
}
def _neutral_only(values: tuple) -> dict:
    """Another server's field (daemon/openai_fields.py) served only at a value that leaves
    the answer as it is: the schema shows those values."""
    def one(value) -> dict:
        if value is None:
            return _NULL
        if value == []:
            return {"type": "array", "maxItems": 0}
        if value == {}:
            return {"type": "object", "maxProperties": 0}
        return {"const": value}
    return {"anyOf": [one(v) for v in values], "default": values[0],
            "description": "another server's extension, served only at this value"}


#: Rules across fields (JSON Schema 2020-12), so generated bodies keep them.
_CHAT_RULES = {"if": {"required": ["top_logprobs"], "properties": {
    "top_logprobs": {"type": "integer"}}},
    "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}}
_COMPLETION_RULES = {"not": {"required": ["echo", "logprobs"], "properties": {
    "echo": {"const": True}, "logprobs": {"type": "integer"}}}}


def _integers_up_to(m: int) -> str:
    """A regex for the decimal integers 0..m, without leading zeros."""
    digits = str(m)
    alternatives = ["0"]
    if len(digits) > 1:  # fewer digits than m
        alternatives.append(f"[1-9][0-9]{{0,{len(digits) - 2}}}")
    for i, digit in enumerate(digits):  # as many digits, smaller from position i on
        low, high = (1 if i == 0 else 0), int(digit) - 1
        if high >= low:
            rest = len(digits) - i - 1
            alternatives.append(digits[:i] + f"[{low}-{high}]" + (f"[0-9]{{{rest}}}" if rest else ""))
    alternatives.append(digits)
    return "^(" + "|".join(alternatives) + ")$"


def _server_limits(components: dict, model_names: list[str] | None,
                   max_tokens_limit: int | None, vocab_size: int | None,
                   max_model_len: int | None) -> None:
    """Narrow the generated schemas to what this server accepts."""
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        props = components[name]["properties"]
        if model_names:
            props["model"] = {"anyOf": [{"type": "string", "enum": list(model_names)},
                                        {"type": "null"}], "default": None,
                              "description": "a served model (GET /v1/models); null: the first"}
        if max_tokens_limit:
            for field in ("max_tokens", "max_completion_tokens"):
                if field in props:
                    _branch(props[field], "integer")["maximum"] = max_tokens_limit
        if vocab_size:
            _branch(props["logit_bias"], "object")["propertyNames"] = {
                "pattern": _integers_up_to(vocab_size - 1)}
        props["n"]["description"] = f"n x prompts at most {MAX_CHOICES}"
        props.update({k: v for k, v in _UNUSED_ONLY.items() if k in props})
        foreign = {**FOREIGN_FIELDS, **(CHAT_FOREIGN_FIELDS if name == "ChatCompletionRequest"
                                        else {})}
        props.update({k: _neutral_only(v) for k, v in foreign.items() if k not in props})
    message = components["ChatMessage"]
    message["properties"]["tool_calls"] = _UNUSED_ONLY["functions"]  # a subset: see _UNUSED_ONLY
    message["required"] = sorted({*message.get("required", []), "content"})  # without calls
    components["ChatCompletionRequest"].update(_CHAT_RULES)
    components["CompletionRequest"].update(_COMPLETION_RULES)
    ids: dict = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
    if vocab_size:
        ids["items"]["maximum"] = vocab_size - 1
    if max_model_len:
        ids["maxItems"] = max_model_len - 1
    components["CompletionRequest"]["properties"]["prompt"] = {"anyOf": [
        {"type": "string"}, ids,
        {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": MAX_CHOICES},
        {"type": "array", "items": ids, "minItems": 1, "maxItems": MAX_CHOICES}],
        "description": "a text, token ids, or a batch of either (one choice per prompt x n)"}


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


#: The SLO headers (daemon/slo_headers.py); decimals are accepted too, the body's fields win.
SLO_HEADERS = [{"name": name, "in": "header", "required": False, "description": (
    f"{what} target in milliseconds, more than 0 and at most a day; the body's "
    f"`{field}` (seconds) wins when given"),
    "schema": {"type": "string", "pattern": "^[1-9][0-9]{0,6}$"}}
    for name, what, field in ((TTFT_HEADER, "Time-to-first-token", "ttft_slo"),
                              (TPOT_HEADER, "Time-between-tokens", "tbt_slo"))]


def build_openapi(*, model_names: list[str] | None = None, max_tokens_limit: int | None = None,
                  vocab_size: int | None = None, max_model_len: int | None = None,
                  api_key_required: bool = False) -> dict:
    """The OpenAPI 3.1 document; the keyword arguments narrow it to one server."""
    components = copy.deepcopy(_components())
    _server_limits(components, model_names, max_tokens_limit, vocab_size, max_model_len)
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
    probe = {"application/json": {"schema": {"type": "object"}}}
    probes = {path: {"get": {**_operation(f"{what} (no API key needed)",
                                          ok={"description": "yes", "content": probe}),
                             "responses": {"200": {"description": "yes", "content": probe},
                                           "503": {"description": "no, and why",
                                                   "content": probe}}}}
              for path, what in (("/livez", "Kubernetes liveness: an instance serves, or "
                                            "the daemon drains"),
                                 ("/readyz", "Kubernetes readiness: it accepts requests and "
                                             "an instance serves"))}
    spec = {
        "openapi": "3.1.0",
        "info": {"title": "Ascendra", "version": "1",
                 "description": "OpenAI-compatible completions and chat completions. Every "
                                "error is JSON in OpenAI's error shape."},
        "paths": {
            "/v1/completions": {"post": {**_operation(
                "Text completion", "CompletionRequest", generated, api_key_required, body_errors),
                "parameters": SLO_HEADERS}},
            "/v1/chat/completions": {"post": {**_operation(
                "Chat completion", "ChatCompletionRequest", generated, api_key_required,
                body_errors), "parameters": SLO_HEADERS}},
            "/tokenize": {"post": _operation(
                "A prompt's tokens as the completion endpoints count them (the chat "
                "template applied to `messages`)", "TokenizeRequest",
                {"description": "the count, the tokens and the context limit",
                 "content": {"application/json": {"schema": {
                     "$ref": _REF.format(name="TokenizeResponse")}}}},
                api_key_required, body_errors)},
            "/v1/models": {"get": _operation(
                "The served model", ok={"description": "a list with the one served model",
                                        "content": {"application/json": {"schema": {
                                            "type": "object"}}}},
                secured=api_key_required)},
            "/v1/models/{model}": {"get": {**_operation(
                "One model by its id (404 unless it is the served one)",
                ok={"description": "the model", "content": {"application/json": {"schema": {
                    "type": "object"}}}}, secured=api_key_required, errors=("404",)),
                "parameters": [{"name": "model", "in": "path", "required": True,
                                "schema": {"type": "string", "minLength": 1}}]}},
            "/health": {"get": health},
            **probes,
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
