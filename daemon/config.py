"""`ascendra serve` configuration: one msgspec struct, set in TOML, overridden by flags.

Every field can be written in the TOML file (`port = 8000`) and given as a flag
(`--port 8000`); a flag wins. Validation errors name the field.
"""
from __future__ import annotations

import argparse
import tomllib
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from daemon.layout import parse_layout
from engines.executors.latency import make_latency
from policies.offload import DEFAULT_OFFLOAD_THRESHOLD

PositiveInt = Annotated[int, Meta(ge=1)]
PositiveFloat = Annotated[float, Meta(gt=0)]


class ServeConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    model: str = ""                     # Hugging Face model folder; "" = the built-in tiny model
    served_model_name: str = ""         # the name /v1/models lists; "" = the model folder's name
    layout: str = "1xsarathi"           # instances and their modes, e.g. 3xsarathi
    executor: Literal["torch", "sim"] = "torch"
    sim_latency: str = "zero"           # sim executor's latency: zero | constant:SECONDS | profile:NAME
    profile: str = ""                   # shorthand for sim_latency = "profile:NAME" (a GPU profile)
    device: str = ""                    # cpu | cuda; "" = cuda when available
    gpus: list[int] = []                # GPU ids dealt out to instances in order
    gpus_per_instance: PositiveInt = 1
    host: str = "127.0.0.1"
    port: Annotated[int, Meta(ge=0, le=65535)] = 8000
    api_key: str = ""                   # also $ASCENDRA_API_KEY; "" = no authentication
    chunk_size: PositiveInt = 512       # token budget of one engine step
    max_num_seqs: PositiveInt | None = None  # default from the mode (LP: 128)
    value_function: Literal["edf", "sjf", "ljf", "fcfs"] = "edf"  # LP/HP order of waiting prompts
    offload_threshold: Annotated[float, Meta(ge=0)] = DEFAULT_OFFLOAD_THRESHOLD  # LP offloads below this x worst HP latency
    drop_expired: bool = False          # drop waiting requests whose TTFT SLO is lost
    block_size: PositiveInt = 16
    num_kv_blocks: PositiveInt | None = None
    ttft_slo: PositiveFloat = 1.0       # default per-request TTFT target, seconds
    tbt_slo: PositiveFloat = 0.15       # default per-request TBT target, seconds
    default_max_tokens: PositiveInt = 256
    max_tokens_limit: PositiveInt = 4096
    max_body_bytes: PositiveInt = 1 << 20
    drain_timeout: Annotated[float, Meta(ge=0)] = 30.0
    max_queued_requests: PositiveInt = 1024     # accepted requests without a first token yet
    max_queued_tokens: PositiveInt = 1 << 20    # ... and their prompt tokens; more -> 503
    recovery_timeout: Annotated[float, Meta(ge=0)] = 10.0  # wait for an instance to take over
    runtime_dir: str = ""               # ipc socket folder; "" = $RUNTIME_DIRECTORY or a temp dir
    heartbeat_interval: PositiveFloat = 1.0
    restart_backoff_max: PositiveFloat = 30.0
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    def __post_init__(self) -> None:
        # Checked with the config, not later in serve() or an instance process.
        parse_layout(self.layout, self.gpus or None, self.gpus_per_instance)  # "layout: ..."
        field = "profile" if self.profile else "sim_latency"
        try:
            make_latency(self.resolved_sim_latency)
        except ValueError as exc:
            raise ValueError(f"{field}: {exc}") from None

    @property
    def resolved_sim_latency(self) -> str:
        return f"profile:{self.profile}" if self.profile else self.sim_latency


def load_config(path: str | None = None, overrides: dict | None = None) -> ServeConfig:
    """Read TOML (if any), apply non-None overrides, validate. Errors name the field."""
    data: dict = {}
    if path:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"config {path}: {exc}") from None
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return msgspec.convert(data, ServeConfig, strict=False)
    except msgspec.ValidationError as exc:
        raise ValueError(f"config: {exc}") from None


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per config field (`max_num_seqs` -> `--max-num-seqs`), default None = unset.

    Flags arrive as text and are converted with the same validation as TOML values.
    """
    for field in msgspec.structs.fields(ServeConfig):
        is_list = field.default_factory is list
        parser.add_argument(
            "--" + field.name.replace("_", "-"), dest=field.name, default=None,
            type=(lambda s: [x for x in s.split(",") if x.strip()]) if is_list else str,
            help=f"config {field.name} (default {[] if is_list else field.default!r})")


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    overrides = {f: getattr(args, f, None) for f in ServeConfig.__struct_fields__}
    return load_config(getattr(args, "config", None), overrides)
