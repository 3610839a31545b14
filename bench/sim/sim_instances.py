"""The simulated box: its settings (`SimConfig`) and one instance core per GPU instance.

Each instance is the real `InstanceCore` (scheduler, policies, performance model) over a
`SimExecutor` whose latency function is a GPU profile (or
`SimConfig.latency`, the daemon's `--sim-latency`). LP/HP performance models are
calibrated as a daemon's instance calibrates its own at start.

With `SimConfig.models` every instance is a multiplexed one (engines/mux_core.py): a
`MuxCore` over one sim executor per model, each on its own profile, a step lasting the
sum of the models' parts (engines/executors/mux_executor.py), their KV pool what the
GPU's memory holds after every model's weights (`mux_pool_units`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from daemon.config import InstancesConfig
from daemon.core.controller_config import ControllerConfig, SloConfig, TenantsConfig
from bench.sim.host_charges import host_costs, with_host_steps
from bench.sim.speed_trace import SpeedTrace
from daemon.core.esp_groups import EspSettings
from engines.executors.latency import make_latency
from engines.executors.profiles.registry import get_profile
from engines.executors.sim_executor import SimExecutor
from engines.executors.mux_executor import MuxExecutor
from engines.instance_core import InstanceCore
from engines.kv_pool import unit_bytes
from engines.mux_build import build_mux_core, units_per_block
from engines.modes import get_mode, role_of_mode
from engines.perf_setup import profile_perf_model
from engines.scheduler_config import SchedulerConfig
from ipc.messages import ToInstance


@dataclass(frozen=True)
class SimConfig:
    layout_modes: tuple[str, ...]     # mode per instance, e.g. ("lp", "lp", "hp")
    profile: str = "a100-llama3-8b"
    scheduler: SchedulerConfig = SchedulerConfig()
    slo: SloConfig = SloConfig()
    controller: ControllerConfig = ControllerConfig()
    tenants: TenantsConfig = TenantsConfig()
    block_size: int = InstancesConfig().block_size
    max_model_len: int = 8192
    ipc_delay: float = 0.0005         # one controller <-> instance message, seconds
    #: The sim executor's latency spec, as the daemon's `--sim-latency` ("constant:0.05");
    #: "" = the profile's step times. LP/HP performance models are then calibrated on
    #: what it states, as a daemon's sim instance does.
    latency: str = ""
    #: KV capacity per instance in blocks; None = the profile's (its GPU's memory).
    num_kv_blocks: int | None = None
    #: The link a P/D layout's KV crosses (engines/executors/profiles/interconnect.py:
    #: "nvlink3", "nvlink4", "pcie4", "pcie5"); "" = the profile GPU's NVLink.
    interconnect: str = ""
    #: An `<n>A` layout: the controller changes instances between LP and HP online.
    dynamic_roles: bool = False
    #: ESP groups for long prompts (daemon/core/esp_groups.py; max_degree 1: off). A
    #: group's prefill step costs `esp_time.esp_prefill_time` on the profile.
    esp: EspSettings = EspSettings()
    #: Multiplexed instances: (served name, profile) of every model each instance holds,
    #: the first the default; a request names its model (`WorkloadRequest.model`).
    #: Empty: each instance runs the one model of `profile`.
    models: tuple[tuple[str, str], ...] = ()
    #: A live run's speed to replay (bench/sim/speed_trace.py): each step's time times
    #: the factor of its window. None: the profile's speed.
    speed_trace: SpeedTrace | None = None


@dataclass
class SimInstance:
    """One instance's core and executor, and where its loop stands."""

    core: InstanceCore
    executor: SimExecutor
    busy: bool = False               # a step is under way (its end is on the heap)
    #: Commands that reached it and wait for its loop to drain them.
    inbox: list[ToInstance] = field(default_factory=list)

    @property
    def instance_id(self) -> int:
        return self.core.instance_id


def build_instance(config: SimConfig, instance_id: int, mode: str) -> SimInstance:
    if config.models:
        return _build_mux_instance(config, instance_id, mode)
    profile = get_profile(config.profile)
    num_kv_blocks = config.num_kv_blocks or profile.num_kv_blocks(config.block_size)
    latency = make_latency(config.latency or f"profile:{config.profile}")
    host = host_costs(profile, config.latency)
    if host is not None:  # a measured profile's host costs: each step pays them too
        latency = with_host_steps(latency, host)
    executor = SimExecutor(latency, num_kv_blocks=num_kv_blocks, block_size=config.block_size,
                           max_model_len=config.max_model_len)
    scheduler = msgspec.structs.replace(config.scheduler, mode=mode)
    perf = None
    if get_mode(mode).uses_perf_model:
        if config.latency:
            perf = _stated_perf_model(profile, executor, scheduler)
        else:
            perf = profile_perf_model(profile, scheduler, config.max_model_len,
                                      executor.num_kv_blocks * config.block_size)
    core = InstanceCore(instance_id, role_of_mode(mode), executor, scheduler, perf)
    return SimInstance(core, executor)


def _stated_perf_model(profile, executor: SimExecutor, scheduler: SchedulerConfig):
    """A performance model on the profile's model and GPU, calibrated on the synthetic
    batches a daemon's sim instance times at start, at the latency the executor states."""
    from engines.calibration import calibrate, default_shapes, stated_latency
    from engines.perf.model import PerfModel
    perf = PerfModel(profile.model, profile.hardware)
    shapes = default_shapes(executor, scheduler.chunk_size, scheduler.resolved_max_num_seqs())
    calibrate(executor, perf, shapes, repeats=1, timer=stated_latency)
    return perf



def mux_pool_units(profiles: dict, block_size: int) -> int:
    """Head-wise units (engines/kv_pool.py) of the KV pool of a GPU holding every model in
    `profiles` (name -> profile, all of one GPU): what the first model's profile leaves
    for KV, less every other model's weights."""
    first = next(iter(profiles.values()))
    kv_bytes = (first.num_kv_blocks(block_size) * block_size * first.kv_bytes_per_token
                - sum(p.weight_bytes for p in list(profiles.values())[1:]))
    head_dim = min(p.model.head_dim for p in profiles.values())
    unit = unit_bytes(block_size, head_dim, first.model.bytes_per_element)
    if kv_bytes < unit:
        raise ValueError(f"models {', '.join(profiles)}: their weights leave no KV memory on "
                         "one GPU")
    return int(kv_bytes // unit)


def _build_mux_instance(config: SimConfig, instance_id: int, mode: str) -> SimInstance:
    profiles = {name: get_profile(profile) for name, profile in config.models}
    shapes = {name: p.model for name, p in profiles.items()}
    units = (config.num_kv_blocks * max(units_per_block(shapes).values())
             if config.num_kv_blocks else mux_pool_units(profiles, config.block_size))
    costs = units_per_block(shapes)
    scheduler = msgspec.structs.replace(config.scheduler, mode=mode)
    executors, perf_models = {}, {}
    for name, profile_name in config.models:
        executors[name] = SimExecutor(make_latency(f"profile:{profile_name}"),
                                      num_kv_blocks=units // costs[name],
                                      block_size=config.block_size,
                                      max_model_len=config.max_model_len)
        if get_mode(mode).uses_perf_model:
            perf_models[name] = profile_perf_model(profiles[name], scheduler, config.max_model_len,
                                                   units // costs[name] * config.block_size)
    core = build_mux_core(instance_id, role_of_mode(mode), executors, shapes, scheduler, units,
                          perf_models)
    return SimInstance(core, MuxExecutor(executors))
