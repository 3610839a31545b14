"""Building a multiplexed instance's core: each model's block cost in the shared pool's
head-wise units (engines/kv_pool.py), and the pool's size.

The pool's unit is a KV head of the narrowest head_dim among the models; its size is
given in units, or as `num_kv_blocks` blocks of the costliest model (so a config's
`num_kv_blocks` means what it means for that model on a dedicated instance); a profile's
is what the GPU's memory holds after every model's weights (bench/sim/sim_instances.py).
"""
from __future__ import annotations

from engines.executors.base import Executor
from engines.kv_pool import KvPool, block_units
from engines.mux_core import MuxCore, MuxModel
from engines.perf.model import PerfModel
from engines.perf.model_shape import ModelShape
from engines.scheduler_config import SchedulerConfig
from ipc.messages import Role


def units_per_block(shapes: dict[str, ModelShape]) -> dict[str, int]:
    """Each model's block cost, in units of the narrowest head_dim among them."""
    head_dim = min(s.head_dim for s in shapes.values())
    return {name: block_units(shape, head_dim) for name, shape in shapes.items()}


def pool_units(shapes: dict[str, ModelShape], num_kv_blocks: int) -> int:
    """A pool of `num_kv_blocks` blocks of the costliest model."""
    return num_kv_blocks * max(units_per_block(shapes).values())


def build_mux_core(instance_id: int, role: Role, executors: dict[str, Executor],
                   shapes: dict[str, ModelShape], config: SchedulerConfig, num_units: int,
                   perf_models: dict[str, PerfModel] | None = None) -> MuxCore:
    """A MuxCore over `executors` (by served name, the first the default model); each
    executor must hold KV tensors for `num_units // its block cost` blocks."""
    costs = units_per_block(shapes)
    models = [MuxModel(name, executor, costs[name], (perf_models or {}).get(name))
              for name, executor in executors.items()]
    return MuxCore(instance_id, role, models, config, KvPool(num_units))


def build_mux_instance(config):
    """(MuxCore, MuxExecutor) of an instance process's config (`InstanceConfig` with
    `models`): each model's executor built with its folder and its share of the pool's
    tensors, each model's performance model as a dedicated instance's."""
    import msgspec

    from engines.executors.build import build_executor
    from engines.executors.executor_config import SIM_DEFAULT_KV_BLOCKS
    from engines.executors.mux_executor import MuxExecutor
    from engines.models.builtin import builtin_tiny_model_dir
    from engines.models.model_config import ModelConfig
    from engines.perf_setup import build_perf_model
    dirs = {m.name: m.model_dir or str(builtin_tiny_model_dir()) for m in config.models}
    shapes = {name: ModelShape.from_config(ModelConfig.from_pretrained(d))
              for name, d in dirs.items()}
    given = config.executor.num_kv_blocks
    units = (pool_units(shapes, given or SIM_DEFAULT_KV_BLOCKS)
             if given or config.executor.kind == "sim" else _torch_pool_units(config, shapes))
    costs = units_per_block(shapes)
    executors, perf_models = {}, {}
    for name, model_dir in dirs.items():
        executor_config = msgspec.structs.replace(config.executor, model_dir=model_dir,
                                                  num_kv_blocks=units // costs[name])
        executors[name] = build_executor(executor_config)
        perf_models[name] = build_perf_model(executors[name], executor_config, config.scheduler)
    core = build_mux_core(config.instance_id, config.resolved_role, executors, shapes,
                          config.scheduler, units, perf_models)
    return core, MuxExecutor(executors)


def _torch_pool_units(config, shapes: dict[str, ModelShape]) -> int:
    """A torch instance's pool when `num_kv_blocks` is unset: on CUDA 90 % of the free
    memory less every model's weights (read before any is loaded), on the CPU the fixed
    budget a dedicated instance's KV cache gets; in units of the models' dtype (fp32 on
    the CPU, as the executor runs there)."""
    import torch

    from engines.executors.profiles.kv_capacity import MEMORY_UTILIZATION, weight_bytes
    from engines.executors.torch_executor import CPU_KV_CACHE_BYTES
    from engines.kv_pool import unit_bytes
    device = torch.device(config.executor.device
                          or ("cuda" if torch.cuda.is_available() else "cpu"))
    head_dim = min(s.head_dim for s in shapes.values())
    if device.type != "cuda":
        return CPU_KV_CACHE_BYTES // unit_bytes(config.executor.block_size, head_dim, 4)
    free, _ = torch.cuda.mem_get_info(device)
    element = max(s.bytes_per_element for s in shapes.values())
    budget = MEMORY_UTILIZATION * free - sum(weight_bytes(s) for s in shapes.values())
    units = int(budget // unit_bytes(config.executor.block_size, head_dim, element))
    if units < max(units_per_block(shapes).values()):
        raise RuntimeError(f"no memory left for a KV pool after the weights of "
                           f"{', '.join(shapes)} ({free} bytes free)")
    return units
