"""Starting instance processes: the command line and environment of one, or a Popen.

One process per instance; its GPUs are pinned with CUDA_VISIBLE_DEVICES from
`InstanceConfig.gpus`. An asyncio supervisor can use the pieces directly:

    config = with_parent(config)
    proc = await asyncio.create_subprocess_exec(*instance_command(config),
                                                env=instance_env(config))
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import msgspec

from engines.instance_config import InstanceConfig

#: The folder holding the engines/ and ipc/ packages, so `-m engines.instance_main`
#: resolves from any working directory.
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def with_parent(config: InstanceConfig, pid: int | None = None) -> InstanceConfig:
    """`config` with parent_pid set (default: this process), so the instance exits when
    this process dies -- even if it dies before the instance has started."""
    if config.parent_pid is not None:
        return config
    return msgspec.structs.replace(config, parent_pid=os.getpid() if pid is None else pid)


def instance_command(config: InstanceConfig, python: str = sys.executable) -> list[str]:
    return [python, "-m", "engines.instance_main", "--config-json", config.to_json()]


def instance_env(config: InstanceConfig, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    if config.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, config.gpus))
    paths = [str(PROJECT_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def spawn_instance(config: InstanceConfig, **popen_kwargs) -> subprocess.Popen:
    """Start one instance process; it sends Ready on the config's endpoint when it serves."""
    config = with_parent(config)
    popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen(instance_command(config), env=instance_env(config), **popen_kwargs)
