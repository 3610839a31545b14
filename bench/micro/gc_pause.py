"""How long one full garbage collection stalls a serving process, before and after its
start-up heap is frozen (engines/gc_freeze.py).

`instance`: what an instance process builds before its loop -- the torch executor on the
built-in tiny model and an LP engine with its calibrated performance model.
`controller`: the modules the controller process loads (aiohttp, msgspec, the daemon).
Each runs in a fresh interpreter, so neither sees the other's objects. A full collection
(`gc.collect()`) is timed `--repeats` times before `freeze_startup_heap()` and after.

    python -m bench.micro.gc_pause [--process instance controller] [--repeats 5]
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import statistics
import subprocess
import sys
import time

from engines.gc_freeze import freeze_startup_heap


_ALIVE: list = []
#: What the controller process loads: its HTTP app, the controller, the tokenizer.
CONTROLLER_MODULES = ("daemon.api", "daemon.controller", "daemon.served_models",
                      "daemon.http_guard", "engines.models.tokenizer")


def build_instance() -> None:
    from engines.executors.profiles.registry import get_profile
    from engines.executors.torch_executor import TorchExecutor
    from engines.instance_core import InstanceCore
    from engines.models.builtin import builtin_tiny_model_dir
    from engines.perf_setup import profile_perf_model
    from engines.scheduler_config import SchedulerConfig
    from ipc.messages import Role
    executor = TorchExecutor(builtin_tiny_model_dir(), device="cpu")
    config = SchedulerConfig(mode="lp")
    perf = profile_perf_model(get_profile("a100-llama3-8b"), config, executor.max_model_len,
                              executor.num_kv_blocks * executor.block_size)
    # as long as the process, as there
    _ALIVE.append((executor, InstanceCore(0, Role.LP, executor, config, perf)))


def build_controller() -> None:
    for module in CONTROLLER_MODULES:
        importlib.import_module(module)


BUILDERS = {"instance": build_instance, "controller": build_controller}


def full_collections(repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - start)
    return times


def measure(process: str, repeats: int) -> dict:
    """In this interpreter: build `process`'s start-up heap, time full collections."""
    BUILDERS[process]()
    gc.collect()
    tracked = len(gc.get_objects())
    before = full_collections(repeats)
    frozen = freeze_startup_heap()
    after = full_collections(repeats)
    return {"tracked": tracked, "frozen": frozen, "before_ms": statistics.median(before) * 1e3,
            "after_ms": statistics.median(after) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--process", nargs="+", choices=sorted(BUILDERS),
                        default=["instance", "controller"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", choices=sorted(BUILDERS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        json.dump(measure(args.child, args.repeats), sys.stdout)
        return
    print(f"one full gc.collect(), median of {args.repeats}, before and after the freeze")
    for process in args.process:
        out = subprocess.run([sys.executable, "-m", "bench.micro.gc_pause", "--child", process,
                              "--repeats", str(args.repeats)],
                             capture_output=True, text=True, check=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        print(f"  {process:10s} {row['tracked']:>8,} objects tracked at start-up: "
              f"{row['before_ms']:8.2f} ms -> {row['after_ms']:6.3f} ms after freezing "
              f"{row['frozen']:,}")


if __name__ == "__main__":
    main()
