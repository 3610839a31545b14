"""What the micro-benches (`bench.micro.schedule_latency`, `bench.micro.policy_latency`) share
to time themselves and to compare with another checkout: the clocks `--clock` picks, and one
run of the same script on another checkout's code (`--compare DIR`), whose figures come back
as JSON on its standard output (`--emit-json`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

#: What `--clock` reads: seconds as a float. `cpu` counts the calling thread's CPU time,
#: steadier on a machine busy with other work.
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def run_elsewhere(script: str, checkout: Path, flags: list[str]):
    """`script` (this file's path) run with `flags` and `--emit-json` on `checkout`'s code
    (its folder first on PYTHONPATH, the same python); its decoded JSON output. This
    checkout comes second on the path, for the modules an older checkout lacks (this one)."""
    command = [sys.executable, str(Path(script).resolve()), *flags, "--emit-json"]
    ours = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(checkout.resolve()), str(ours)]))
    done = subprocess.run(command, env=env, cwd=checkout, check=True, capture_output=True,
                          text=True)
    return json.loads(done.stdout)
