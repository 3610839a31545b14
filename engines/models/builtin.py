"""The built-in tiny model: made on first use in a cache directory, then reused."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("ASCENDRA_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ascendra")
    return Path(root)


def builtin_tiny_model_dir_name(seed: int = 0) -> str:
    """The folder name of the tiny checkpoint for `seed` (the name `serve` gives it)."""
    return f"tiny-llama-seed{seed}"


def builtin_tiny_model_dir(seed: int = 0) -> Path:
    """Path of the tiny Llama checkpoint for `seed`, writing it first if it is not there."""
    target = cache_dir() / builtin_tiny_model_dir_name(seed)
    if (target / "config.json").exists():
        return target
    from engines.models.tiny import make_tiny_model  # torch: only when it must be made
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-", dir=target.parent))
    try:
        make_tiny_model(staging, seed=seed)
        os.replace(staging, target)  # atomic: a concurrent maker either wins or finds it done
    except OSError:
        if not (target / "config.json").exists():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
