"""An instance's performance model: built for the modes that decide by predicted time,
on the device's roofline numbers, and calibrated on the real executor at start."""
from __future__ import annotations

import logging
from pathlib import Path

from engines.executors.executor_config import ExecutorConfig
from engines.modes import get_mode
from engines.scheduler_config import SchedulerConfig
from engines.perf.calibration_shapes import calibration_shapes
from engines.perf.hardware_spec import HARDWARE
from engines.perf.model_shape import ModelShape
from engines.perf.model import PerfModel

log = logging.getLogger(__name__)

#: What a sim executor's batches are modelled on when no GPU profile names one.
SIM_HARDWARE = "a100"


def build_perf_model(executor, executor_config: ExecutorConfig,
                     scheduler_config: SchedulerConfig) -> PerfModel | None:
    """None for modes that make no time-based decisions (sarathi, vllm)."""
    if not get_mode(scheduler_config.mode).uses_perf_model:
        return None
    if executor_config.kind == "torch" and executor_config.perf_profile:
        return _profiled_torch_model(executor, executor_config, scheduler_config)
    if executor_config.kind == "torch":
        return _calibrated_torch_model(executor, scheduler_config)
    if executor_config.latency.startswith("profile:"):
        from engines.executors.profiles.registry import get_profile
        profile = get_profile(executor_config.latency.split(":", 1)[1], executor_config.tp)
        return profile_perf_model(profile, scheduler_config, executor.max_model_len,
                                  executor.num_kv_blocks * executor.block_size)
    return _calibrated_sim_model(executor, executor_config, scheduler_config)


def _calibrated_sim_model(executor, executor_config: ExecutorConfig,
                          scheduler_config: SchedulerConfig) -> PerfModel:
    """On the model folder's shapes, fitted to what the latency function states."""
    from engines.calibration import calibrate, default_shapes, stated_latency
    perf = PerfModel(_model_shape(executor_config.model_dir), HARDWARE[SIM_HARDWARE])
    shapes = default_shapes(executor, scheduler_config.chunk_size,
                            scheduler_config.resolved_max_num_seqs())
    calibrate(executor, perf, shapes, repeats=1, timer=stated_latency)
    return perf


def profile_perf_model(profile, scheduler_config: SchedulerConfig, max_context: int,
                       kv_tokens: int) -> PerfModel:
    """A model on a GPU profile's shapes and device, calibrated on the profile's step
    times for the usual synthetic batches (what a real instance measures at start)."""
    perf = PerfModel(profile.model, profile.hardware)
    for shape in calibration_shapes(scheduler_config.chunk_size, max_context,
                                    scheduler_config.resolved_max_num_seqs(), kv_tokens):
        perf.observe(shape, profile.step_time(shape))
    perf.refit()
    return perf


def _model_shape(model_dir: str) -> ModelShape:
    from engines.models.builtin import builtin_tiny_model_dir
    from engines.models.model_config import ModelConfig
    return ModelShape.from_config(ModelConfig.from_pretrained(Path(model_dir or builtin_tiny_model_dir())))


def _profiled_torch_model(executor, executor_config: ExecutorConfig,
                          scheduler_config: SchedulerConfig) -> PerfModel:
    """From a measured profile of this executor (`perf_profile`), timing nothing; a
    profile of another model shape or TP degree is refused (ValueError)."""
    import time
    from engines.executors.profiles.measured import check_model, load_measured
    started = time.perf_counter()
    profile = load_measured(executor_config.perf_profile)
    shape = ModelShape.from_config(executor.config, bytes_per_element=executor.dtype.itemsize)
    check_model(profile, shape, executor_config.model_dir or "the built-in tiny model")
    if profile.data.tp != executor_config.tp:
        raise ValueError(f"perf_profile {profile.name!r} was measured at tp {profile.data.tp}; "
                         f"this instance runs tp {executor_config.tp}")
    perf = profile_perf_model(profile, scheduler_config, executor.max_model_len,
                              executor.num_kv_blocks * executor.block_size)
    log.info("performance model from %s in %.3f s (no calibration): held-out MAPE %s",
             profile.name, time.perf_counter() - started,
             f"{perf.mape:.1%}" if perf.mape is not None else "n/a")
    return perf


def _calibrated_torch_model(executor, scheduler_config: SchedulerConfig) -> PerfModel:
    from engines.calibration import calibrate, default_shapes
    from engines.hardware import hardware_for
    shape = ModelShape.from_config(executor.config,
                                   bytes_per_element=executor.dtype.itemsize)
    perf = PerfModel(shape, hardware_for(executor.device, executor.dtype))
    shapes = default_shapes(executor, scheduler_config.chunk_size,
                            scheduler_config.resolved_max_num_seqs())
    report = calibrate(executor, perf, shapes)
    log.info("performance model calibrated on %d batches in %.1f s: held-out MAPE %s",
             report.measured, report.seconds,
             f"{perf.mape:.1%}" if perf.mape is not None else "n/a")
    return perf
