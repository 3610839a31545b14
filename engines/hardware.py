"""The device's roofline numbers for the performance model: a spec sheet for known GPUs,
a quick measurement (a timed matmul and a timed copy) for a CPU or an unknown GPU."""
from __future__ import annotations

import time

import torch

from engines.perf.hardware_spec import HardwareSpec, hardware_for_device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_time(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up: first-call allocations and thread start-up
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def measure_device(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, *,
                   matmul_size: int = 1024, copy_bytes: int = 64 * 2**20,
                   repeats: int = 3) -> HardwareSpec:
    """Achieved FLOP/s of one square matmul and bytes/s of one large copy (read + write).
    About 0.1-0.5 s on a laptop CPU."""
    device = torch.device(device)
    a = torch.randn(matmul_size, matmul_size, dtype=dtype, device=device)
    b = torch.randn(matmul_size, matmul_size, dtype=dtype, device=device)
    flops = 2 * matmul_size**3 / _best_time(lambda: torch.mm(a, b), device, repeats)
    src = torch.empty(copy_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    src.fill_(1.0)
    bandwidth = 2 * copy_bytes / _best_time(lambda: dst.copy_(src), device, repeats)
    return HardwareSpec.measured(f"{device.type}-measured", flops, bandwidth)


def measure_cpu(dtype: torch.dtype = torch.float32) -> HardwareSpec:
    return measure_device("cpu", dtype)


def hardware_for(device: str | torch.device, dtype: torch.dtype = torch.float32) -> HardwareSpec:
    """The spec-sheet entry for a known GPU (A100/H100/H200), else a measurement."""
    device = torch.device(device)
    if device.type == "cuda":
        spec = hardware_for_device(torch.cuda.get_device_name(device))
        if spec is not None:
            return spec
    return measure_device(device, dtype)
