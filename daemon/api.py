"""The HTTP API (aiohttp): OpenAI-compatible completions and chat, streaming or not.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
GET /health, GET /metrics, GET /openapi.json (the OpenAPI 3.1 description).

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

from aiohttp import web

from daemon.config import ServeConfig
from daemon.detokenizer import IncrementalDetokenizer
from daemon.errors import ApiError
from daemon.openai_schema import ChatCompletionRequest, CompletionRequest, parse_body
from daemon.openapi import build_openapi
from daemon.responses import ResponseBuilder, error_body

log = logging.getLogger(__name__)
CONTROLLER = web.AppKey("controller", object)
LIMITS = web.AppKey("limits", object)
API_KEY_REQUIRED = web.AppKey("api_key_required", bool)
#: Routes served without the API key: probes, Prometheus and the API's description.
PUBLIC_PATHS = frozenset({"/health", "/metrics", "/openapi.json"})
#: Body types read as JSON: JSON (and `*/*+json`), and the generic types clients send when
#: not told otherwise (`curl -d`: form-urlencoded; fetch() with a string: text/plain; raw
#: bytes: octet-stream). Any other type (multipart forms, XML, images, ...) is a 415.
JSON_CONTENT_TYPES = frozenset({"application/json", "application/x-www-form-urlencoded",
                                "text/plain", "application/octet-stream"})
API_KEY_ENV = "ASCENDRA_API_KEY"


def json_error(status: int, message: str, code: str | None = None, param: str | None = None,
               headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error_body(message, status, param=param, code=code), status=status,
                             headers=headers)


def resolve_api_key(config: ServeConfig, environ=os.environ) -> str:
    """The key clients must send: the config's (`--api-key`), else `$ASCENDRA_API_KEY`."""
    return config.api_key or environ.get(API_KEY_ENV, "")


def build_app(controller, config: ServeConfig, api_key: str = "") -> web.Application:
    app = web.Application(client_max_size=config.max_body_bytes,
                          middlewares=[_errors_as_json, _require_api_key(api_key)])
    app[CONTROLLER] = controller
    app[LIMITS] = config
    app[API_KEY_REQUIRED] = bool(api_key)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
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
        return path
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
    controller = request.app[CONTROLLER]
    prompt_ids = _prompt_ids(controller, body.prompt)
    return await _serve(request, body, prompt_ids, ResponseBuilder(
        f"cmpl-{uuid.uuid4().hex}", controller.model_name, chat=False))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body = _parse(await _read_json_body(request), ChatCompletionRequest)
    controller = request.app[CONTROLLER]
    text = _render_chat(controller.tokenizer, [{"role": m.role, "content": m.text()}
                                               for m in body.messages])
    prompt_ids = controller.tokenizer.encode(text, add_bos=False)
    return await _serve(request, body, prompt_ids, ResponseBuilder(
        f"chatcmpl-{uuid.uuid4().hex}", controller.model_name, chat=True), field="messages")


def _render_chat(tokenizer, messages: list[dict[str, str]]) -> str:
    """The chat as prompt text; a template that refuses the messages is the client's 400
    (e.g. Llama's "roles must alternate user/assistant"), not a server error."""
    try:
        return tokenizer.apply_chat_template(messages)
    except ValueError as exc:  # e.g. a model without a chat template
        raise BadRequest(f"messages: {exc}", "messages") from None
    except Exception as exc:
        if type(exc).__module__.split(".")[0] != "jinja2":
            raise
        raise BadRequest(f"messages: the model's chat template refused them: {exc}",
                         "messages") from None


def _parse(raw: bytes, kind):
    try:
        return parse_body(raw, kind)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


def _prompt_ids(controller, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        return controller.tokenizer.encode(prompt)
    vocab = controller.vocab_size
    bad = next((t for t in prompt if not 0 <= t < vocab), None)
    if bad is not None:
        raise BadRequest(f"prompt: token id {bad} is outside the vocabulary (0..{vocab - 1})")
    return prompt


def _check_request(controller, limits: ServeConfig, body, prompt_ids: list[int],
                   field: str = "prompt"):
    if not prompt_ids:
        raise BadRequest(f"{field}: the prompt is empty", field)
    limit = controller.max_model_len
    if limit <= 0:  # no instance has said it is ready (e.g. the only one is restarting)
        raise ApiError(503, "no instance is ready; try again shortly", "unavailable")
    if len(prompt_ids) >= limit:
        raise BadRequest(f"{field}: the prompt is {len(prompt_ids)} tokens; the limit is "
                         f"{limit - 1} (context length {limit})", field)
    try:
        sampling = body.sampling(limits.default_max_tokens, limits.max_tokens_limit)
        stops = body.stop_strings()
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    if body.model and body.model != controller.model_name:
        raise ApiError(404, f"model: {body.model!r} is not served here; use {controller.model_name!r}",
                       "model_not_found")
    return sampling, stops


async def _serve(request: web.Request, body, prompt_ids: list[int], builder: ResponseBuilder,
                 field: str = "prompt"):
    controller = request.app[CONTROLLER]
    sampling, stops = _check_request(controller, request.app[LIMITS], body, prompt_ids, field)
    handle = await controller.submit(prompt_ids, sampling, ttft_slo=body.ttft_slo, tbt_slo=body.tbt_slo,
                               priority=body.priority, request_id=builder.id)
    detok = IncrementalDetokenizer(controller.tokenizer, stops)
    try:
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return await _stream(request, handle, detok, builder, len(prompt_ids), include_usage)
        return await _complete(handle, detok, builder, len(prompt_ids))
    finally:  # aborts on the instance if it is still running (disconnects, stop strings)
        handle.close("completed" if detok.stopped else "cancelled")


async def _complete(handle, detok: IncrementalDetokenizer, builder, num_prompt: int) -> web.Response:
    pieces, finish, count = [], "length", 0
    async for output in handle.tokens():
        count += 1
        pieces.append(detok.add(output.token_id))
        finish = output.finish_reason or finish
        if detok.stopped:
            finish = "stop"
            break
    pieces.append(detok.flush())
    return web.json_response(builder.full("".join(pieces), finish, num_prompt, count))


async def _stream(request, handle, detok, builder, num_prompt: int, include_usage: bool):
    first = await handle.first()  # errors before the first token still get a JSON status
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)
    send = lambda obj: response.write(b"data: " + json.dumps(obj).encode() + b"\n\n")  # noqa: E731
    count, started = 0, False
    try:
        async for output in handle.tokens(first):
            count += 1
            text = detok.add(output.token_id)
            finish = "stop" if detok.stopped else output.finish_reason
            if finish:
                text += detok.flush()
            # one event per token, even when its text is still held back (a partial
            # character, a possible stop string): clients time tokens by events
            await send(builder.chunk(text, finish, first=not started))
            started = True
            if finish:
                break
        if include_usage:
            await send(builder.usage_chunk(num_prompt, count))
    except ApiError as exc:  # failed mid-stream: an SSE error event, then the end marker
        await send(error_body(exc.message, exc.status, code=exc.code))
    await response.write(b"data: [DONE]\n\n")
    return response


async def models(request: web.Request) -> web.Response:
    controller = request.app[CONTROLLER]
    return web.json_response({"object": "list", "data": [
        {"id": controller.model_name, "object": "model", "created": 0, "owned_by": "ascendra",
         "max_model_len": controller.max_model_len}]})


async def health(request: web.Request) -> web.Response:
    status = request.app[CONTROLLER].health()
    return web.json_response(status, status=200 if status["status"] == "ok" else 503)


async def openapi(request: web.Request) -> web.Response:
    controller, limits = request.app[CONTROLLER], request.app[LIMITS]
    return web.json_response(build_openapi(
        model_name=controller.model_name, max_tokens_limit=limits.max_tokens_limit,
        vocab_size=controller.vocab_size, max_model_len=controller.max_model_len or None,
        api_key_required=request.app[API_KEY_REQUIRED]))


async def metrics(request: web.Request) -> web.Response:
    body = request.app[CONTROLLER].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})
