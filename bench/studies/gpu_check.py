"""`python -m bench.studies.gpu_check --out DIR`: the engine on one CUDA GPU, in one command.

Phases (`--phases`, default all, in this order; each writes its part of DIR as it ends,
so a run cut short still leaves what it measured):

* `measure` (bench/studies/gpu_measure.py): the card's ceilings, the paged decode kernel's error,
  a Llama-3-8B-shape checkpoint written and loaded, decode and prefill step times against
  their rooflines, beside the simulator's profiles. -> DIR/gpu_check.json
* `kernels` (bench/studies/gpu_kernels.py; runs inside `measure`, on its loaded model):
  the decode kernel's launch choices swept, each linear layer's read rate, a profiled
  decode graph by kind of kernel, and the step with and without the fused element-wise
  kernels. -> DIR/gpu_kernels.json
* `tests`: the test suite on this machine (CUDA present: the executor tests run bf16 on
  the GPU). -> DIR/pytest.txt
* `live`: `ascendra serve` on the 8B-shape checkpoint, every instance on this one GPU,
  and `ascendra bench` at one point per workload, for each layout. -> DIR/live_*.json

The device machine of #30 had no flash-attn and no network, so the decode path is the
Triton kernel (engines/models/paged_decode.py), which ships with PyTorch's CUDA builds.
"""
from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import traceback
from pathlib import Path

from bench.launch.daemon_launcher import DaemonStartError, ServeProcess, launch_started
from bench.json_file import write_json
from bench.studies.gpu_measure import make_model, run_measure

LIVE_WORKLOADS = ("poisson", "bursty-cv4", "mixed-slo")


def run_tests(out: Path, timeout: int) -> int:
    """The test suite here (pytest-xdist spreads it over the cores when installed)."""
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
            "tests"]
    if importlib.util.find_spec("xdist"):  # pytest-xdist: spread over the cores
        args += ["-n", "8"]
    else:  # setup.cfg's addopts name xdist's -n
        args += ["-o", "addopts=-q -rs"]
    with open(out / "pytest.txt", "w") as log:
        try:
            return subprocess.run(args, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            log.write(f"\n(stopped after {timeout} s)\n")
            return 124


def run_live(out: Path, model_dir: Path, layouts: list[str], qps: float, duration: float,
             kv_blocks: int) -> None:
    """Each layout serving the 8B-shape model with every instance on this GPU, and one
    bench point per workload."""
    for layout in layouts:
        daemon = ServeProcess(["--model", str(model_dir), "--executor", "torch", "--device",
                               "cuda", "--layout", layout, "--num-kv-blocks", str(kv_blocks),
                               "--cuda-graph-max-batch", "64"],
                              log_path=out / f"serve_{layout}.log", start_timeout=240)
        try:
            launch_started(daemon)
        except DaemonStartError as exc:
            print(f"{layout}: {exc}", flush=True)
            continue
        try:
            for workload in LIVE_WORKLOADS:
                target = out / f"live_{layout}_{workload}.json"
                subprocess.run([sys.executable, "-m", "daemon.cli", "bench", "--url", daemon.url,
                                "--workload", workload, "--qps", str(qps), "--duration",
                                str(duration), "--seed", "0", "--max-model-len", "8192",
                                "--json", str(target), "--disable-tqdm"], timeout=duration * 4)
        finally:
            daemon.stop()


def run_measure_phases(out: Path, model_dir: Path, kernels: bool) -> None:
    """`measure`, and `kernels` on the model it loaded."""
    def study(executor, ceilings):
        from bench.studies.gpu_kernels import run_kernel_study
        write_json(out / "gpu_kernels.json", run_kernel_study(executor, ceilings))
    run_measure(out, model_dir, then=study if kernels else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.gpu_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/llama3-8b-random"))
    parser.add_argument("--phases", default="measure,kernels,tests,live")
    parser.add_argument("--test-timeout", type=int, default=180)
    parser.add_argument("--layouts", default="2L1H,3xsarathi")
    parser.add_argument("--qps", type=float, default=6.0)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--kv-blocks", type=int, default=8192,
                        help="KV blocks per live instance (16 tokens, 2 MiB each at 8B shape)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    phases = args.phases.split(",")
    kernels = "kernels" in phases  # not a phase of its own: it runs inside `measure`
    phases = list(dict.fromkeys("measure" if p == "kernels" else p for p in phases))
    runs = {
        "measure": lambda: run_measure_phases(args.out, args.model_dir, kernels),
        "tests": lambda: print(f"tests: exit {run_tests(args.out, args.test_timeout)}"),
        "live": lambda: (make_model(args.model_dir),
                         run_live(args.out, args.model_dir, args.layouts.split(","), args.qps,
                                  args.duration, args.kv_blocks)),
    }
    failed = []
    for phase in phases:
        try:  # a phase that breaks leaves the others their time on the lent machine
            runs[phase]()
        except Exception:
            traceback.print_exc()
            failed.append(phase)
    if failed:
        print(f"phases that failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
