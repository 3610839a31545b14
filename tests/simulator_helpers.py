"""Helpers shared by the simulator tests (tests/test_simulator*.py)."""
from __future__ import annotations

import json
from pathlib import Path

import msgspec
import numpy as np

from bench.records import RunResult
from bench.simulate import simulate
from bench.simulator import SimConfig
from bench.traces import TRACE_FILES, traces_dir
from daemon.layout import layout_modes
from engines.scheduler_config import SchedulerConfig


def length_trace(folder: Path) -> str:
    """ShareGPT when the shared traces are beside this checkout, else a seeded stand-in file
    with ShareGPT-like lengths (so the tests run, deterministically, without it)."""
    if (traces_dir() / TRACE_FILES["sharegpt"]).exists():
        return "sharegpt"
    rng = np.random.default_rng(7)
    prompts = np.clip(rng.lognormal(5.5, 1.0, 2000), 4, 6000).astype(int)
    outputs = np.clip(rng.lognormal(5.0, 0.9, 2000), 2, 1500).astype(int)
    path = folder / "sharegpt-like.csv"
    path.write_text("prompt_tokens,output_tokens\n"
                    + "".join(f"{p},{o}\n" for p, o in zip(prompts, outputs)))
    return str(path)


def sim_config(layout: str, **fields) -> SimConfig:
    scheduler = fields.pop("scheduler", SchedulerConfig())
    return SimConfig(layout_modes=tuple(layout_modes(layout)), scheduler=scheduler, **fields)


def run(layout: str, trace: str, *, qps: float, num_requests: int, seed: int = 0,
        **fields) -> RunResult:
    """One simulated run with every request's record kept."""
    return simulate(sim_config(layout, **fields), trace=trace, qps=qps,
                    num_requests=num_requests, seed=seed, keep_records=True)


def without_wall_time(result: RunResult) -> RunResult:
    """The result less what legitimately differs between identical runs (wall time)."""
    config = {k: v for k, v in result.config.items() if k != "wall_s"}
    return msgspec.structs.replace(result, config=config)


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)
