"""Shared fixtures."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """One tiny checkpoint per architecture (llama, qwen2, mistral), made once per session."""
    from engines.models.tiny import ARCHS, make_tiny_model
    root = tmp_path_factory.mktemp("tiny-models")
    return {arch: make_tiny_model(root / arch, seed=0, arch=arch) for arch in ARCHS}
