"""The HTTP app (`daemon.api.build_app`) in-process over a fake controller: no instance
processes, so every input path of the API can be driven fast and deterministically."""
from __future__ import annotations

import asyncio
import contextlib

from aiohttp.test_utils import TestClient, TestServer

from daemon.api import build_app
from daemon.config import ServeConfig
from daemon.metrics import Metrics
from daemon.request_handle import RequestHandle
from ipc.messages import TokenOutput


class FakeController:
    """What the API needs of daemon.controller.Controller. Each request gets `max_tokens`
    copies of `token_id`, the last with finish_reason "length"."""

    def __init__(self, tokenizer, model_name: str = "tiny", max_model_len: int = 64,
                 token_id: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.model_name = model_name
        self.max_model_len = max_model_len
        if token_id is None:
            token_id = tokenizer.encode("a", add_bos=False)[0]
        self.token_id = token_id
        self.metrics = Metrics()
        self.submitted: list[tuple[list[int], object]] = []
        self.fail_with: BaseException | None = None
        self.open: dict[str, RequestHandle] = {}

    async def submit(self, prompt_token_ids, sampling, *, request_id, **_):
        if self.fail_with is not None:
            raise self.fail_with
        self.submitted.append((prompt_token_ids, sampling))
        handle = RequestHandle(request_id, 0.0,
                               lambda h, outcome: self.open.pop(h.request_id, None))
        self.open[request_id] = handle
        loop = asyncio.get_running_loop()
        for i in range(sampling.max_tokens):
            last = i == sampling.max_tokens - 1
            loop.call_soon(handle.put, TokenOutput(request_id, self.token_id,
                                                   "length" if last else None), 0.0)
        return handle

    def health(self) -> dict:
        return {"status": "ok", "model": self.model_name, "requests_in_flight": len(self.open),
                "instances": []}


def fake_config(**overrides) -> ServeConfig:
    return ServeConfig(executor="sim", **overrides)


@contextlib.asynccontextmanager
async def api_client(controller: FakeController, api_key: str = "", **config):
    """An aiohttp TestClient on the real app (real middlewares and limits) on 127.0.0.1."""
    app = build_app(controller, fake_config(**config), api_key)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield client
