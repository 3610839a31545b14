"""How well the performance model predicts batch times on a real executor.

1. calibrate: the start-up pass of synthetic batches (engines.calibration);
2. serve: N random serving-like batches, each predicted, then timed and observed, with the
   model refitting whenever its policy says so (as an instance does while serving);
after each phase it prints the coefficients, the held-out MAPE the model reports, and the
MAPE on a fixed test set of other random batches it never observed. The pure roofline
(default coefficients) on that test set, and how much two timings of the same batches
differ (the noise floor), are printed for comparison. Figures only, no pass/fail.
Default: the built-in tiny Llama on CPU.

    python -m bench.studies.perf_model_accuracy [--batches 300] [--model DIR] [--device cuda]
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from engines.calibration import calibrate, default_shapes, measure
from engines.executors.torch_executor import TorchExecutor
from engines.hardware import hardware_for
from engines.models.builtin import builtin_tiny_model_dir
from engines.perf.calibration_shapes import random_shapes
from engines.perf.model_shape import ModelShape
from engines.perf.model import COEFFICIENT_NAMES, PerfModel


def mape_on(perf: PerfModel, timings) -> float:
    predicted = np.array([perf.predict(shape) for shape, _ in timings])
    measured = np.array([seconds for _, seconds in timings])
    return float(np.mean(np.abs(predicted - measured) / measured))


def show(label: str, perf: PerfModel, timings) -> None:
    coeffs = ", ".join(f"{n}={c:.4g}" for n, c in zip(COEFFICIENT_NAMES, perf.coefficients))
    held = "n/a" if perf.mape is None else f"{perf.mape:.1%}"
    print(f"{label:<22} held-out MAPE {held:>7}   test-set MAPE {mape_on(perf, timings):6.1%}"
          f"   samples {perf.num_samples:5d}\n{'':<22} {coeffs}")


def serve(executor, perf: PerfModel, shapes, seed: int) -> int:
    """Observe each batch as an instance would; returns how many refits happened."""
    timings, _ = measure(executor, shapes, seed=seed)
    refits = 0
    for shape, seconds in timings:
        perf.observe(shape, seconds)
        if perf.should_refit():
            refits += perf.refit()
    return refits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the built-in tiny Llama)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batches", type=int, default=300, help="serving batches to observe")
    parser.add_argument("--test-batches", type=int, default=60)
    parser.add_argument("--token-budget", type=int, default=512)
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--max-context", type=int, default=1024)
    parser.add_argument("--num-kv-blocks", type=int, default=2048)
    args = parser.parse_args()

    executor = TorchExecutor(args.model or builtin_tiny_model_dir(), device=args.device,
                             num_kv_blocks=args.num_kv_blocks)
    hw = hardware_for(executor.device, executor.dtype)
    element = torch.empty((), dtype=executor.dtype).element_size()
    model = ModelShape.from_config(executor.config, bytes_per_element=element)
    print(f"{executor.config.model_type} on {executor.device} ({executor.dtype}); {hw.name}: "
          f"{hw.peak_flops / 1e12:.3g} TFLOP/s, {hw.bandwidth / 1e9:.3g} GB/s ({hw.source})")

    cap = (executor.num_kv_blocks - args.max_batch) * executor.block_size
    sizes = (args.token_budget, args.max_context, args.max_batch, cap)
    test_shapes = random_shapes(args.test_batches, *sizes, seed=1)
    test, _ = measure(executor, test_shapes, seed=1)
    again = np.array([seconds for _, seconds in measure(executor, test_shapes, seed=1)[0]])
    first = np.array([seconds for _, seconds in test])
    noise = np.mean(np.abs(again - first) / first)
    print(f"timing noise: the test set timed twice differs by {noise:.1%} (MAPE between the two)")
    perf = PerfModel(model, hw)
    show("roofline (no fit)", perf, test)

    shapes = default_shapes(executor, args.token_budget, args.max_batch, args.max_context)
    report = calibrate(executor, perf, shapes)
    print(f"calibration: {report.measured} batches, {report.skipped} skipped, "
          f"{report.seconds:.2f} s")
    show("after calibration", perf, test)

    refits = serve(executor, perf, random_shapes(args.batches, *sizes, seed=2), seed=2)
    show(f"after {args.batches} batches", perf, test)
    print(f"({refits} refits while serving)")


if __name__ == "__main__":
    main()
