"""The HTTP API (aiohttp): OpenAI-compatible completions and chat, streaming or not.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
GET /health, GET /metrics. Every error is JSON in OpenAI's error shape.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import uuid

from aiohttp import web

from daemon.config import ServeConfig
from daemon.detokenizer import IncrementalDetokenizer
from daemon.errors import ApiError
from daemon.openai_schema import ChatCompletionRequest, CompletionRequest, parse_body
from daemon.responses import ResponseBuilder, error_body

log = logging.getLogger(__name__)
CONTROLLER = web.AppKey("controller", object)
LIMITS = web.AppKey("limits", object)


def json_error(status: int, message: str, code: str | None = None,
               headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error_body(message, status, code=code), status=status,
                             headers=headers)


def build_app(controller, config: ServeConfig, api_key: str = "") -> web.Application:
    app = web.Application(client_max_size=config.max_body_bytes,
                          middlewares=[_errors_as_json, _require_api_key(api_key)])
    app[CONTROLLER] = controller
    app[LIMITS] = config
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


@web.middleware
async def _errors_as_json(request: web.Request, handler):
    try:
        return await handler(request)
    except ApiError as exc:
        return json_error(exc.status, exc.message, exc.code, headers=exc.headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 413:
            return json_error(413, f"request body is larger than the limit of "
                                   f"{request.app[LIMITS].max_body_bytes} bytes")
        return json_error(exc.status, exc.reason)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("error handling %s %s", request.method, request.path)
        return json_error(500, "internal server error")


def _require_api_key(api_key: str):
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def check(request: web.Request, handler):
        if api_key and request.path.startswith("/v1/"):
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                raise ApiError(401, "missing or wrong API key (send Authorization: Bearer <key>)",
                               "invalid_api_key")
        return await handler(request)

    return check


async def completions(request: web.Request) -> web.StreamResponse:
    body = _parse(await request.read(), CompletionRequest)
    controller = request.app[CONTROLLER]
    prompt_ids = _prompt_ids(controller, body.prompt)
    return await _serve(request, body, prompt_ids, ResponseBuilder(
        f"cmpl-{uuid.uuid4().hex}", controller.model_name, chat=False))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body = _parse(await request.read(), ChatCompletionRequest)
    controller = request.app[CONTROLLER]
    text = controller.tokenizer.apply_chat_template([{"role": m.role, "content": m.text()}
                                                     for m in body.messages])
    prompt_ids = controller.tokenizer.encode(text, add_bos=False)
    return await _serve(request, body, prompt_ids, ResponseBuilder(
        f"chatcmpl-{uuid.uuid4().hex}", controller.model_name, chat=True))


def _parse(raw: bytes, kind):
    try:
        return parse_body(raw, kind)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None


def _prompt_ids(controller, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        return controller.tokenizer.encode(prompt)
    vocab = controller.vocab_size
    bad = next((t for t in prompt if not 0 <= t < vocab), None)
    if bad is not None:
        raise ApiError(400, f"prompt: token id {bad} is outside the vocabulary (0..{vocab - 1})")
    return prompt


def _check_request(controller, limits: ServeConfig, body, prompt_ids: list[int]):
    if not prompt_ids:
        raise ApiError(400, "prompt: is empty")
    limit = controller.max_model_len
    if len(prompt_ids) >= limit:
        raise ApiError(400, f"prompt: {len(prompt_ids)} tokens; the limit is {limit - 1} "
                            f"(context length {limit})")
    try:
        sampling = body.sampling(limits.default_max_tokens, limits.max_tokens_limit)
        stops = body.stop_strings()
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    if body.model and body.model != controller.model_name:
        raise ApiError(404, f"model: {body.model!r} is not served here; use {controller.model_name!r}",
                       "model_not_found")
    return sampling, stops


async def _serve(request: web.Request, body, prompt_ids: list[int], builder: ResponseBuilder):
    controller = request.app[CONTROLLER]
    sampling, stops = _check_request(controller, request.app[LIMITS], body, prompt_ids)
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


async def metrics(request: web.Request) -> web.Response:
    body = request.app[CONTROLLER].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})
