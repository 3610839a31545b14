"""The HTTP API (aiohttp): OpenAI-compatible completions and chat, streaming or not.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
GET /v1/models/{id}, GET /health, GET /livez, GET /readyz (the Kubernetes probes,
daemon/health.py), GET /metrics, GET /openapi.json (the OpenAPI 3.1
description). A request's `model` picks the controller of that model
(daemon/served_models.py); it becomes one engine request per choice
(daemon/request_plan.py), served together as one response (daemon/response_streamer.py). Its
latency targets may also come from the `x-llm-d-slo-ttft-ms` / `x-llm-d-slo-tpot-ms`
headers (or their old `x-slo-*` names), the body's fields winning (daemon/slo_headers.py);
a queue TTL from `x-llm-d-inference-ttl` (daemon/ttl_header.py).

Every error the application answers is JSON in OpenAI's error shape, its message (and
`param`) naming the field. Limits: bodies over `max_body_bytes` get 413, prompts must
be shorter than the context, `max_tokens` at most `max_tokens_limit`. With an API key
every route but PUBLIC_PATHS needs `Authorization: Bearer <key>` (compared in constant
time); unknown paths too, so they reveal nothing without it.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import re
import uuid

import msgspec
from aiohttp import web

from daemon.response_streamer import RunningChoice, complete, serving_info, stream, submit
from daemon.config import HttpConfig
from daemon.errors import ApiError
from daemon.logprobs import token_text_for
from daemon.openai_fields import check_undeclared
from daemon.openai_schema import (
    ChatCompletionRequest, CompletionRequest, TokenizeRequest, TokenizeResponse, parse_body,
)
from daemon.openapi import build_openapi
from daemon.request_plan import Limits, Prompt, plan_choices
from daemon.responses import ResponseBuilder, error_body, model_object
from daemon.core.admission_bounds import RESTARTING_RETRY_AFTER
from daemon.served_models import ServedModels, model_not_found
from daemon.slo_headers import BadSloHeader, with_header_slos
from daemon.structured import CHECKS, GrammarFieldError, requested_grammar
from daemon.tenant_headers import BadIdentityHeader, identity
from daemon.tool_calls import (
    ToolError, ToolPlan, plan_tools, renders_tools, system_tools_message, template_message,
)
from daemon.ttl_header import header_ttl
from ipc.params import GrammarSpec

log = logging.getLogger(__name__)
MODELS = web.AppKey("models", ServedModels)
LIMITS = web.AppKey("limits", object)
API_KEY_REQUIRED = web.AppKey("api_key_required", bool)
#: Routes served without the API key: probes, Prometheus and the API's description.
PUBLIC_PATHS = frozenset({"/health", "/livez", "/readyz", "/metrics", "/openapi.json"})
#: Body types read as JSON: JSON (and `*/*+json`), and the generic types clients send when
#: not told otherwise (`curl -d`: form-urlencoded; fetch() with a string: text/plain; raw
#: bytes: octet-stream). Any other type (multipart forms, XML, images, ...) is a 415.
JSON_CONTENT_TYPES = frozenset({"application/json", "application/x-www-form-urlencoded",
                                "text/plain", "application/octet-stream"})
API_KEY_ENV = "ASCENDRA_API_KEY"


def json_error(status: int, message: str, code: str | None = None, param: str | None = None,
               headers: dict[str, str] | None = None, extra: dict | None = None) -> web.Response:
    """OpenAI's error shape; `extra`: fields beside `error` (e.g. `serving_info`)."""
    return web.json_response({**error_body(message, status, param=param, code=code),
                              **(extra or {})}, status=status, headers=headers)


def resolve_api_key(config: HttpConfig, environ=os.environ) -> str:
    """The key clients must send: the config's (`--api-key`), else `$ASCENDRA_API_KEY`."""
    return config.api_key or environ.get(API_KEY_ENV, "")


def build_app(served, config: HttpConfig, api_key: str = "") -> web.Application:
    """The API over `served` (a ServedModels, or one model's controller)."""
    app = web.Application(client_max_size=config.max_body_bytes,
                          middlewares=[_errors_as_json, _require_api_key(api_key)])
    app[MODELS] = served if isinstance(served, ServedModels) else ServedModels([served])
    app[LIMITS] = config
    app[API_KEY_REQUIRED] = bool(api_key)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model:.+}", model)
    app.router.add_get("/health", health)
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    return app


class BadRequest(ApiError):
    """A 400 about one field of the request; `param` names it (from the message)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(400, message)
        self.param = param or field_of(message)


_AT_PATH = re.compile(r" at `\$\.?([^`]*)`")
_MISSING = re.compile(r"missing required field `([^`]+)`")
_LEADING_FIELD = re.compile(r"^([A-Za-z_][\w.\[\]]*): ")


def field_of(message: str) -> str | None:
    """The field a validation message is about: msgspec's `... - at `$.a[0].b``, its
    `missing required field `x``, or our own `field: ...` messages."""
    at, missing = _AT_PATH.search(message), _MISSING.search(message)
    path = at.group(1) if at else ""
    if missing:
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
    if path:
        return path.replace("[...]", "")  # a dict's value: name the dict
    leading = _LEADING_FIELD.match(message)
    return leading.group(1) if leading else None


@web.middleware
async def _errors_as_json(request: web.Request, handler):
    try:
        return await handler(request)
    except ApiError as exc:
        return json_error(exc.status, exc.message, exc.code, getattr(exc, "param", None),
                          getattr(exc, "headers", None))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 413:
            return json_error(413, f"request body is larger than the limit of "
                                   f"{request.app[LIMITS].max_body_bytes} bytes",
                              "body_too_large")
        if exc.status == 405:
            allow = exc.headers.get("Allow", "")
            return json_error(405, f"method {request.method} is not allowed on {request.path}"
                                   f" (allowed: {allow})", "method_not_allowed",
                              headers={"Allow": allow})
        if exc.status == 404:
            return json_error(404, f"no route {request.path}", "not_found")
        return json_error(exc.status, exc.reason)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("error handling %s %s", request.method, request.path)
        return json_error(500, "internal server error")


def _digest(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


def _is_public(request: web.Request) -> bool:
    resource = request.match_info.route.resource  # None for 404s and 405s
    return resource is not None and resource.canonical in PUBLIC_PATHS


def _require_api_key(api_key: str):
    """Deny by default: every route but PUBLIC_PATHS needs `Authorization: Bearer <key>`.
    Both sides are hashed first, so the comparison is constant-time and of a fixed
    length (it leaks neither the key's bytes nor its length)."""
    expected = _digest(api_key.encode())

    @web.middleware
    async def check(request: web.Request, handler):
        if api_key and not _is_public(request):
            scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
            # surrogateescape: header bytes that are not UTF-8 compare, never raise
            given = _digest(token.strip().encode("utf-8", "surrogateescape"))
            matches = hmac.compare_digest(given, expected)
            if not (matches and scheme.lower() == "bearer"):
                raise ApiError(401, "missing or wrong API key (send Authorization: Bearer <key>)",
                               "invalid_api_key")
        return await handler(request)

    return check


async def _read_json_body(request: web.Request) -> bytes:
    if "Content-Type" in request.headers and request.content_type not in JSON_CONTENT_TYPES \
            and not request.content_type.endswith("+json"):
        raise ApiError(415, f"Content-Type: {request.content_type!r} is not supported; send the "
                            "body as application/json", "unsupported_media_type")
    return await request.read()  # 413 past client_max_size


async def completions(request: web.Request) -> web.StreamResponse:
    body = _parse(await _read_json_body(request), CompletionRequest)
    controller = request.app[MODELS].pick(body.model)
    try:
        entries = body.prompts()
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    prompts = [_prompt(controller, field, prompt, body.echo) for field, prompt in entries]
    grammar = await _grammar(controller, body, None)
    return await _serve(request, body, prompts, ResponseBuilder(
        f"cmpl-{uuid.uuid4().hex}", controller.model_name, chat=False), grammar)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body = _parse(await _read_json_body(request), ChatCompletionRequest)
    controller = request.app[MODELS].pick(body.model)
    try:
        tools = plan_tools(body.tools, body.tool_choice,
                           controller.tokenizer.chat_template if body.tools else None)
    except ToolError as exc:
        raise BadRequest(str(exc), exc.param) from None
    text = _render_chat(controller.tokenizer, [template_message(m) for m in body.messages], tools)
    prompt = Prompt("messages", controller.tokenizer.encode(text, add_bos=False))
    grammar = await _grammar(controller, body, tools)
    return await _serve(request, body, [prompt], ResponseBuilder(
        f"chatcmpl-{uuid.uuid4().hex}", controller.model_name, chat=True), grammar, tools)


async def _grammar(controller, body, tools: ToolPlan | None) -> GrammarSpec | None:
    """What the output must match (daemon/structured.py, a forced tool call), compiled off
    the event loop; a 400 naming the field that cannot be."""
    try:
        found = requested_grammar(body)
        for i, tool in enumerate(tools.tools if tools else ()):
            parameters = tool["function"].get("parameters")
            if parameters is not None:
                await CHECKS.check(controller.tokenizer, f"tools[{i}].function.parameters",
                                   GrammarSpec("json_schema", json.dumps(parameters)))
        forced = tools.grammar() if tools else None
        if forced is not None and found is not None:
            raise GrammarFieldError(found[0], "cannot be combined with a forced tool call "
                                              "(tool_choice)")
        if forced is not None:
            found = ("tools", forced)
        if found is not None:
            await CHECKS.check(controller.tokenizer, *found)
    except GrammarFieldError as exc:
        raise BadRequest(str(exc), exc.param) from None
    return found[1] if found else None


async def tokenize(request: web.Request) -> web.Response:
    """A prompt's tokens as `/v1/completions` or `/v1/chat/completions` would count them
    (the chat template applied): load testers fit their requests to the context with it."""
    body = _parse(await _read_json_body(request), TokenizeRequest)
    if (body.prompt is None) == (body.messages is None):
        raise BadRequest("give exactly one of prompt and messages", "prompt")
    controller = request.app[MODELS].pick(body.model)
    if body.messages is not None:
        text = _render_chat(controller.tokenizer, [template_message(m) for m in body.messages])
        tokens = controller.tokenizer.encode(text, add_bos=False)
    else:
        tokens = controller.tokenizer.encode(body.prompt)
    return web.Response(body=msgspec.json.encode(TokenizeResponse(
        count=len(tokens), max_model_len=controller.max_model_len, tokens=tokens)),
        content_type="application/json")


def _render_chat(tokenizer, messages: list[dict], tools: ToolPlan | None = None) -> str:
    """The chat as prompt text, with the tools where the template puts them (a template
    that does not render tools gets them as a first system message); a template that
    refuses the messages is the client's 400 (e.g. Llama's "roles must alternate
    user/assistant"), not a server error."""
    template_tools = None
    if tools is not None and renders_tools(tokenizer.chat_template):
        template_tools = tools.tools
    elif tools is not None:
        messages = [system_tools_message(tools.tools), *messages]
    try:
        if template_tools is None:
            return tokenizer.apply_chat_template(messages)
        return tokenizer.apply_chat_template(messages, tools=template_tools)
    except ValueError as exc:  # e.g. a model without a chat template
        raise BadRequest(f"messages: {exc}", "messages") from None
    except Exception as exc:
        if type(exc).__module__.split(".")[0] != "jinja2":
            raise
        raise BadRequest(f"messages: the model's chat template refused them: {exc}",
                         "messages") from None


def _parse(raw: bytes, kind):
    try:
        body = parse_body(raw, kind)
        check_undeclared(raw, kind)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    return body


def _prompt(controller, field: str, prompt: str | list[int], echo: bool) -> Prompt:
    if isinstance(prompt, str):
        return Prompt(field, controller.tokenizer.encode(prompt), prompt if echo else "")
    vocab = controller.vocab_size
    bad = next((t for t in prompt if not 0 <= t < vocab), None)
    if bad is not None:
        raise BadRequest(f"{field}: token id {bad} is outside the vocabulary (0..{vocab - 1})",
                         field)
    return Prompt(field, prompt, controller.tokenizer.decode(prompt) if echo else "")


async def _serve(request: web.Request, body, prompts: list[Prompt], builder: ResponseBuilder,
                 grammar: GrammarSpec | None = None, tools: ToolPlan | None = None):
    controller, config = request.app[MODELS].pick(body.model), request.app[LIMITS]
    if controller.max_model_len <= 0:  # no instance has said it is ready (one restarting)
        raise ApiError(503, "no instance is ready; try again shortly", "unavailable",
                       retry_after=RESTARTING_RETRY_AFTER)
    try:
        body = with_header_slos(body, request.headers)
        who = identity(body, request.headers, controller.tenants)
        ttl = header_ttl(request.headers)
    except (BadSloHeader, BadIdentityHeader) as exc:
        raise BadRequest(str(exc), exc.param) from None
    try:
        choices = plan_choices(body, prompts, Limits(
            controller.max_model_len, controller.vocab_size, config.default_max_tokens,
            config.max_tokens_limit), grammar)
        stops = body.stop_strings()
    except ValueError as exc:
        raise BadRequest(str(exc), getattr(exc, "param", None)) from None
    handles = await submit(controller, choices, builder.id, body, who, ttl)
    token_text = token_text_for(controller.tokenizer) if body.num_logprobs() is not None else None
    running = [RunningChoice(choice, handle, controller.tokenizer, stops, token_text, builder.chat,
                             tools) for choice, handle in zip(choices, handles)]
    serving = body.return_serving_info
    try:
        if body.stream:
            options = body.stream_options
            include_usage = bool(options and options.include_usage)
            return await stream(request, running, choices, builder, include_usage, serving,
                                bool(options and options.continuous_usage_stats))
        return await complete(running, choices, builder, serving)
    except ApiError as exc:  # it ended before its first token (e.g. dropped): a status
        if not serving:
            raise
        return json_error(exc.status, exc.message, exc.code, headers=exc.headers, extra={
            "serving_info": msgspec.to_builtins(serving_info(running))})


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [
        model_object(p.model_name, p.max_model_len) for p in request.app[MODELS].ports]})


async def model(request: web.Request) -> web.Response:
    served, name = request.app[MODELS], request.match_info["model"]
    controller = served.by_name.get(name)
    if controller is None:
        raise model_not_found(name, served.names)
    return web.json_response(model_object(controller.model_name, controller.max_model_len))


async def health(request: web.Request) -> web.Response:
    state = request.app[MODELS].health()  # a daemon.health.Health
    return web.Response(body=msgspec.json.encode(state), content_type="application/json",
                        status=200 if state.status == "ok" else 503)


async def livez(request: web.Request) -> web.Response:
    return _probe(request.app[MODELS].liveness())  # a daemon.health.Probe


async def readyz(request: web.Request) -> web.Response:
    return _probe(request.app[MODELS].readiness())


def _probe(probe) -> web.Response:
    """200 when the probe holds, else 503 (what a Kubernetes httpGet probe reads)."""
    return web.Response(body=msgspec.json.encode(probe), content_type="application/json",
                        status=200 if probe.ok else 503)


async def openapi(request: web.Request) -> web.Response:
    served, limits = request.app[MODELS], request.app[LIMITS]
    return web.json_response(build_openapi(  # the limits of the most generous model
        model_names=served.names, max_tokens_limit=limits.max_tokens_limit,
        vocab_size=max(c.vocab_size for c in served.controllers),
        max_model_len=max(c.max_model_len for c in served.controllers) or None,
        api_key_required=request.app[API_KEY_REQUIRED]))


async def metrics(request: web.Request) -> web.Response:
    body = request.app[MODELS].render_metrics()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})
