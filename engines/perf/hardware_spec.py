"""Peak FLOP/s and memory bandwidth of a device: the denominators of the roofline.

GPU figures are vendor specs (dense bf16/fp16 tensor-core peak, HBM bandwidth); a CPU
has no spec sheet we can trust, so the engines measure one at start
(`engines.hardware.measure_cpu`) and wrap the result with `HardwareSpec.measured`.
The regression's coefficients absorb how far real kernels stay below these peaks.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    peak_flops: float   # FLOP/s
    bandwidth: float    # bytes/s
    source: str = "vendor spec"

    def __post_init__(self) -> None:
        if not (self.peak_flops > 0 and self.bandwidth > 0):
            raise ValueError(f"{self.name}: peak_flops and bandwidth must be > 0, got "
                             f"{self.peak_flops}, {self.bandwidth}")

    @classmethod
    def measured(cls, name: str, flops: float, bandwidth: float) -> "HardwareSpec":
        return cls(name, float(flops), float(bandwidth), source="measured")


HARDWARE: dict[str, HardwareSpec] = {
    # the Ascendra paper's own constants for the A100-80G (SXM: 2.04e12 B/s)
    "a100": HardwareSpec("a100", 312e12, 2.0e12),
    "h100": HardwareSpec("h100", 989e12, 3.35e12),   # SXM5
    "h200": HardwareSpec("h200", 989e12, 4.8e12),    # same compute as H100, faster HBM3e
}


def hardware_for_device(device_name: str) -> HardwareSpec | None:
    """The registry entry for a device name such as 'NVIDIA H100 80GB HBM3'; None if unknown."""
    lowered = device_name.lower()
    for key, spec in HARDWARE.items():
        if key in lowered:
            return spec
    return None
