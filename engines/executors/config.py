"""Which executor an instance runs, and building it.

The torch executor (and so torch itself) is imported only when asked for, so the
sim path -- tests, overhead benchmarks, the simulator -- never loads torch.
"""
from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

PositiveInt = Annotated[int, Meta(ge=1)]

#: KV capacity of a sim executor when the config does not say.
SIM_DEFAULT_KV_BLOCKS = 4096


class ExecutorConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    kind: Literal["torch", "sim"] = "sim"
    block_size: PositiveInt = 16
    #: KV cache size in blocks. torch: None sizes it from free memory; sim: None = 4096.
    num_kv_blocks: PositiveInt | None = None
    #: torch: Hugging Face model folder; "" = the built-in tiny model.
    model_dir: str = ""
    #: torch: "cpu" | "cuda" | "cuda:N"; "" = cuda when available.
    device: str = ""
    #: sim: latency function spec, see engines.executors.latency ("zero", "constant:0.01").
    latency: str = "zero"
    #: sim: the context limit (torch takes it from the model's config).
    max_model_len: PositiveInt = 4096


def build_executor(config: ExecutorConfig):
    """An executor (engines.executors.base.Executor) as `config` describes."""
    if config.kind == "sim":
        from engines.executors.latency import make_latency
        from engines.executors.sim_executor import SimExecutor
        return SimExecutor(make_latency(config.latency),
                           num_kv_blocks=config.num_kv_blocks or _sim_kv_blocks(config),
                           block_size=config.block_size, max_model_len=config.max_model_len)
    from engines.executors.torch_executor import TorchExecutor
    from engines.models.builtin import builtin_tiny_model_dir
    model_dir = config.model_dir or builtin_tiny_model_dir()
    return TorchExecutor(model_dir, block_size=config.block_size,
                         num_kv_blocks=config.num_kv_blocks, device=config.device or None)


def _sim_kv_blocks(config: ExecutorConfig) -> int:
    """A GPU profile's KV capacity (80 GB card), else SIM_DEFAULT_KV_BLOCKS."""
    if config.latency.startswith("profile:"):
        from engines.executors.profiles.registry import get_profile
        return get_profile(config.latency.split(":", 1)[1]).num_kv_blocks(config.block_size)
    return SIM_DEFAULT_KV_BLOCKS
