"""The HTTP app (`daemon.api.build_app`) in-process over a fake controller: no instance
processes, so every input path of the API can be driven fast and deterministically."""
from __future__ import annotations

import asyncio
import json
import contextlib

from aiohttp.test_utils import TestClient, TestServer

from daemon.api import build_app
from daemon.config import HttpConfig
from daemon.core.controller_config import TenantsConfig
from daemon.health import Health, Probe
from daemon.metrics import Metrics
from daemon.request_handle import RequestHandle
from ipc.messages import TokenLogprobs, TokenOutput
from policies.tenants import DEFAULT_TENANT


#: The limits the API tests run the app with (tests/conftest.py `client`).
MAX_MODEL_LEN = 64
MAX_TOKENS_LIMIT = 32
MAX_BODY = 4096
LIMITS = dict(max_tokens_limit=MAX_TOKENS_LIMIT, default_max_tokens=4, max_body_bytes=MAX_BODY)
CHAT = [{"role": "user", "content": "hi"}]
HI = {"prompt": "Hi"}


class FakeController:
    """What the API needs of daemon.controller.Controller. Each request gets `max_tokens`
    copies of `token_id`, the last with finish_reason "length" (and certain logprobs when
    asked)."""

    def __init__(self, tokenizer, model_name: str = "tiny", max_model_len: int = 64,
                 token_id: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.model_name = model_name
        self.model_names = [model_name]
        self.max_model_len = max_model_len
        if token_id is None:
            token_id = tokenizer.encode("a", add_bos=False)[0]
        self.token_id = token_id
        self.metrics = Metrics()
        self.tenants = TenantsConfig()
        self.identities: list[tuple[str, int]] = []   # (tenant, priority) per submit
        self.submitted: list[tuple[list[int], object]] = []
        self.request_ids: list[str] = []
        self.fail_with: BaseException | None = None
        self.open: dict[str, RequestHandle] = {}

    async def submit(self, prompt_token_ids, sampling, *, request_id, tenant=DEFAULT_TENANT,
                     priority=0, **_):
        if self.fail_with is not None:
            raise self.fail_with
        self.identities.append((tenant, priority))
        self.submitted.append((prompt_token_ids, sampling))
        self.request_ids.append(request_id)
        handle = RequestHandle(request_id, lambda h, outcome: self.open.pop(h.request_id, None))
        self.open[request_id] = handle
        loop = asyncio.get_running_loop()
        logprobs = None
        if sampling.logprobs is not None:  # certain of its token, like the sim executor
            top = [self.token_id, *range(sampling.logprobs - 1)][:sampling.logprobs]
            logprobs = TokenLogprobs(0.0, top, [0.0] + [-30.0] * (len(top) - 1) if top else [])
        for i in range(sampling.max_tokens):
            last = i == sampling.max_tokens - 1
            loop.call_soon(handle.put, TokenOutput(request_id, self.token_id,
                                                   "length" if last else None, logprobs))
        return handle

    def health(self) -> Health:
        return Health(status="ok", model=self.model_name, requests_in_flight=len(self.open),
                      queued_requests=0, queued_tokens=0)

    def liveness(self) -> Probe:
        return Probe(ok=True, reason="", instances_ready=1, instances=1)

    def readiness(self) -> Probe:
        return Probe(ok=True, reason="", instances_ready=1, instances=1)


def fake_config(**overrides) -> HttpConfig:
    """The API's part of a config, with `overrides` of its fields."""
    return HttpConfig(**overrides)


@contextlib.asynccontextmanager
async def api_client(controller: FakeController, api_key: str = "", **config):
    """An aiohttp TestClient on the real app (real middlewares and limits) on 127.0.0.1."""
    app = build_app(controller, fake_config(**config), api_key)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield client


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
