"""Building the executor an instance runs, from its `ExecutorConfig`.

The torch executor (and so torch itself) is imported only when asked for, so the sim
path -- tests, overhead benchmarks, the simulator -- never loads torch. This lives apart
from the config so that torch_executor.py may read the config's defaults without the
config importing it back.
"""
from __future__ import annotations

import json
from pathlib import Path

from engines.executors.executor_config import (
    SIM_DEFAULT_KV_BLOCKS,
    SIM_DEFAULT_MAX_MODEL_LEN,
    ExecutorConfig,
)


def build_executor(config: ExecutorConfig):
    """An executor (engines.executors.base.Executor) as `config` describes."""
    if config.kind == "sim":
        from engines.executors.latency import make_latency
        from engines.executors.sim_executor import SimExecutor
        from engines.executors.sim_vocabulary import model_text_token_ids
        vocabulary = model_text_token_ids(config.model_dir) if config.model_dir else (0,)
        _check_profile_model(config)
        return SimExecutor(make_latency(_sim_latency(config)),
                           num_kv_blocks=config.num_kv_blocks or _sim_kv_blocks(config),
                           block_size=config.block_size, max_model_len=_sim_max_model_len(config),
                           vocabulary=vocabulary, grammars=_sim_grammars(config.model_dir))
    from engines.executors.torch_executor import TorchExecutor
    from engines.models.builtin import builtin_tiny_model_dir
    model_dir = config.model_dir or builtin_tiny_model_dir()
    if config.tp > 1:
        from engines.tp_ranks import start_ranks
        return start_ranks(config, model_dir)
    return TorchExecutor(model_dir, block_size=config.block_size,
                         num_kv_blocks=config.num_kv_blocks, device=config.device or None,
                         max_model_len=config.max_model_len,
                         cuda_graph_max_batch=config.cuda_graph_max_batch, esp=config.esp,
                         num_threads=config.torch_threads or None)


def _sim_grammars(model_dir: str):
    """The grammars of a sim executor's model (its tokenizer), None without one."""
    if not model_dir or not (Path(model_dir) / "tokenizer.json").is_file():
        return None
    from engines.grammar import Grammars
    from engines.models.tokenizer import Tokenizer
    return Grammars.for_tokenizer(Tokenizer(model_dir))


def _sim_latency(config: ExecutorConfig) -> str:
    """The latency spec, a GPU profile's taken at the instance's tensor-parallel degree."""
    if config.tp > 1 and config.latency.startswith("profile:"):
        from engines.executors.profiles.registry import with_tp
        return "profile:" + with_tp(config.latency.split(":", 1)[1], config.tp)
    return config.latency


def _sim_max_model_len(config: ExecutorConfig) -> int:
    """The configured limit, else the model's (as torch would serve it), else the default."""
    if config.max_model_len is not None:
        return config.max_model_len
    if config.model_dir and (Path(config.model_dir) / "config.json").is_file():
        from engines.models.model_config import ModelConfig
        try:
            return ModelConfig.from_pretrained(config.model_dir).max_model_len
        except ValueError:  # an architecture torch cannot run: the sim only needs the length
            raw = json.loads((Path(config.model_dir) / "config.json").read_text())
            return int(raw.get("max_position_embeddings") or SIM_DEFAULT_MAX_MODEL_LEN)
    return SIM_DEFAULT_MAX_MODEL_LEN


def _check_profile_model(config: ExecutorConfig) -> None:
    """A measured profile (`profile:FILE`) must have been measured on the model folder's
    shape: its step times are that model's."""
    if not (config.latency.startswith("profile:") and config.model_dir):
        return
    from engines.executors.profiles.measured import MeasuredProfile, check_model
    from engines.executors.profiles.registry import get_profile
    from engines.perf.model_shape import ModelShape
    profile = get_profile(config.latency.split(":", 1)[1])
    if isinstance(profile, MeasuredProfile):
        raw = json.loads((Path(config.model_dir) / "config.json").read_text())
        check_model(profile, ModelShape.from_config(raw), config.model_dir)


def _sim_kv_blocks(config: ExecutorConfig) -> int:
    """A GPU profile's KV capacity (80 GB card), else SIM_DEFAULT_KV_BLOCKS."""
    if config.latency.startswith("profile:"):
        from engines.executors.profiles.registry import get_profile
        return get_profile(_sim_latency(config).split(":", 1)[1]).num_kv_blocks(config.block_size)
    return SIM_DEFAULT_KV_BLOCKS
