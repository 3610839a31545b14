"""Shared fixtures."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests import examples


def pytest_configure(config):
    """The fast lane tries fewer examples in each property check (tests/examples.py)."""
    examples.fast_lane = config.option.markexpr.replace(" ", "") == "notslow"


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """One tiny checkpoint per architecture (llama, qwen2, mistral), made once per session."""
    from engines.models.tiny import ARCHS, make_tiny_model
    root = tmp_path_factory.mktemp("tiny-models")
    return {arch: make_tiny_model(root / arch, seed=0, arch=arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def tokenizer(tiny_models):
    """The tiny llama model's tokenizer."""
    from engines.models.tokenizer import Tokenizer
    return Tokenizer(tiny_models["llama"])


@pytest.fixture
def controller(tokenizer):
    """The API tests' fake controller (tests/api_fakes.py): no instance processes."""
    from tests.api_fakes import MAX_MODEL_LEN, FakeController
    return FakeController(tokenizer, max_model_len=MAX_MODEL_LEN)


@pytest.fixture
async def client(controller):
    """The real HTTP app in-process over `controller`, with the API tests' limits."""
    from tests.api_fakes import LIMITS, api_client
    async with api_client(controller, **LIMITS) as c:
        yield c


@pytest.fixture(scope="session")
def daemon_cache(tmp_path_factory) -> Path:
    """ASCENDRA_CACHE for daemon subprocesses, so no test writes to ~/.cache."""
    return tmp_path_factory.mktemp("ascendra-cache")


@pytest.fixture
def daemon_factory(tmp_path, daemon_cache, tiny_models):
    """`start(*flags, **kw)` -> a serving tests.daemon_fixture.Daemon on the tiny llama model,
    ended (with its instance processes) when the test ends."""
    from tests.daemon_fixture import start_daemon
    started = []

    def start(*args: str, **kwargs):
        args = ("--model", str(tiny_models["llama"]), *args)
        daemon = start_daemon(tmp_path / f"daemon{len(started)}", *args, cache_dir=daemon_cache,
                              **kwargs)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.close()
