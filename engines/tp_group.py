"""The torch.distributed group of one tensor-parallel instance's ranks.

NCCL on CUDA, gloo on CPU, rendezvous through a file (no TCP port to pick or race for).
On CUDA a second, gloo, group carries the small host-side collectives (the KV-capacity
agreement, a hand-off's KV gather), which NCCL would want on the device; on CPU the one
gloo group does both.
"""
from __future__ import annotations

from datetime import timedelta

import torch

from engines.models.tensor_parallel import Shard

#: How long a collective may wait for the other ranks (a rank that died is noticed
#: sooner: its instance's supervisor ends the instance, engines/tp_ranks.py).
COLLECTIVE_TIMEOUT_S = 600


def rank_device(device: str, rank: int) -> torch.device:
    """Rank `rank`'s device: cuda:<rank> of the instance's GPUs (CUDA_VISIBLE_DEVICES), or
    the CPU. ValueError naming the setting when there are too few GPUs."""
    kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cpu":
        return torch.device("cpu")
    if kind != "cuda":
        raise ValueError(f"device: with tp > 1 each rank takes cuda:<rank> of the instance's "
                         f"GPUs; give \"cuda\" or \"cpu\", not {device!r}")
    return torch.device("cuda", rank)


def check_devices(device: str, size: int) -> None:
    """ValueError naming `tp` when the instance sees fewer GPUs than ranks."""
    if rank_device(device, 0).type != "cuda":
        return
    count = torch.cuda.device_count()
    if size > count:
        raise ValueError(f"tp: {size} ranks need {size} GPUs, the instance sees {count} "
                         f"(give it more with gpus / --gpus)")


def join(rank: int, size: int, init_method: str, device: torch.device) -> Shard:
    """Join the instance's group as `rank`; this process's Shard."""
    import torch.distributed as dist
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size,
                            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    control = dist.new_group(backend="gloo") if backend == "nccl" else None
    return Shard(rank, size, group=None, control=control)


def smallest(shard: Shard, value: int) -> int:
    """The smallest of every rank's `value` (each rank calls it)."""
    import torch.distributed as dist
    t = torch.tensor([value], dtype=torch.long)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=shard.control)
    return int(t.item())


def gather_to_first(shard: Shard, tensor: torch.Tensor) -> list[torch.Tensor] | None:
    """Every rank's `tensor` (CPU, same shape on each), on rank 0; None on the others."""
    import torch.distributed as dist
    parts = [torch.empty_like(tensor) for _ in range(shard.size)] if shard.rank == 0 else None
    dist.gather(tensor, parts, dst=0, group=shard.control)
    return parts


def leave() -> None:
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
