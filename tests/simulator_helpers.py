"""Helpers shared by the simulator tests (tests/test_simulator*.py)."""
from __future__ import annotations

import json
from pathlib import Path

import msgspec

from bench.records.schema import RunResult
from bench.sim.box_run import simulate
from bench.sim.simulator import SimConfig
from daemon.core.controller_config import SloConfig
from daemon.layout import layout_modes
from engines.scheduler_config import SchedulerConfig


def length_trace() -> str:
    """The trace the simulator tests run: ShareGPT, packaged with bench (bench/data/trace_data)."""
    return "sharegpt"


def sim_config(layout: str, **fields) -> SimConfig:
    """`ttft_slo` / `tbt_slo` among `fields` set the run's default SLOs."""
    scheduler = fields.pop("scheduler", SchedulerConfig())
    slos = {name: fields.pop(name) for name in ("ttft_slo", "tbt_slo") if name in fields}
    return SimConfig(layout_modes=tuple(layout_modes(layout)), scheduler=scheduler,
                     slo=SloConfig(**slos), **fields)


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
