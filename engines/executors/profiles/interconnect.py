"""GPU-to-GPU links: what moving a request's KV cache between instances costs (P/D layouts).

    seconds = KV bytes / link bandwidth + a fixed setup latency per transfer

Bandwidths are one direction's vendor figure scaled by an achieved share, not a
measurement of ours: NVLink 3 (A100 SXM) 300 GB/s a direction, NVLink 4 (H100/H200
SXM) 450 GB/s, PCIe 4.0 x16 32 GB/s and PCIe 5.0 x16 64 GB/s; achieved 80 % (what
NCCL's point-to-point bandwidth tests reach on such links). The setup latency (a
launch and a handshake) is taken as 50 us. DistServe places prefill and decode
instances on NVLink-connected GPUs of one node for exactly this reason: over NVLink
the KV of a 2k-token Llama-3-8B prompt (256 MiB) moves in about 1 ms; over PCIe 4 in
about 10 ms.
"""
from __future__ import annotations

from dataclasses import dataclass

#: Share of the vendor bandwidth a point-to-point copy achieves.
ACHIEVED_SHARE = 0.8
#: Fixed cost of one transfer, seconds.
SETUP_SECONDS = 50e-6


@dataclass(frozen=True)
class Interconnect:
    name: str
    vendor_bytes_per_s: float   # one direction

    @property
    def bytes_per_s(self) -> float:
        return self.vendor_bytes_per_s * ACHIEVED_SHARE

    def transfer_seconds(self, num_bytes: int) -> float:
        return SETUP_SECONDS + num_bytes / self.bytes_per_s


INTERCONNECTS: dict[str, Interconnect] = {i.name: i for i in (
    Interconnect("nvlink3", 300e9),
    Interconnect("nvlink4", 450e9),
    Interconnect("pcie4", 32e9),
    Interconnect("pcie5", 64e9),
)}
#: The link of each GPU's SXM boards (what the profiles' GPUs are), by hardware name.
DEFAULT_FOR_GPU = {"a100": "nvlink3", "h100": "nvlink4", "h200": "nvlink4"}


def get_interconnect(name: str, gpu: str = "a100") -> Interconnect:
    """A link by name ("nvlink3", "pcie4", ...); "" = the GPU's NVLink."""
    key = name or DEFAULT_FOR_GPU.get(gpu, "nvlink3")
    try:
        return INTERCONNECTS[key]
    except KeyError:
        raise ValueError(f"unknown interconnect {name!r}; choose one of "
                         f"{sorted(INTERCONNECTS)}") from None
