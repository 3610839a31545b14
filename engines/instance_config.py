"""The configuration of one instance process, passed to it as JSON on its command line."""
from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from engines.executors.executor_config import ExecutorConfig
from engines.modes import role_of_mode
from engines.scheduler import SchedulerConfig
from ipc.messages import Role


class MuxModelConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One model of a multiplexed instance: its served name and folder ("" = built-in)."""

    name: str
    model_dir: str = ""


class InstanceConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    instance_id: Annotated[int, Meta(ge=0)]
    #: The controller's socket (ControllerChannel.endpoint), an ipc:// endpoint.
    endpoint: str
    #: What the controller routes by; None = from the scheduler mode (lp, hp, else a peer).
    role: Role | None = None
    scheduler: SchedulerConfig = msgspec.field(default_factory=SchedulerConfig)
    executor: ExecutorConfig = msgspec.field(default_factory=ExecutorConfig)
    #: GPU ids this instance may see (CUDA_VISIBLE_DEVICES); [] hides all GPUs; None inherits.
    gpus: list[Annotated[int, Meta(ge=0)]] | None = None
    #: Seconds between unprompted Heartbeats.
    heartbeat_interval: Annotated[float, Meta(gt=0)] = 1.0
    #: Exit when no message came from the controller for this long (seconds); 0 = never.
    #: When set, the controller must Ping more often than this.
    controller_timeout: Annotated[float, Meta(ge=0)] = 0.0
    #: Exit when the parent process is no longer this pid; None = the parent at start-up.
    parent_pid: int | None = None
    log_level: str = "info"
    #: A multiplexed instance (engines/mux_core.py): the models it holds, the first the
    #: default; each runs on an executor of `executor`'s kind and settings (its
    #: `model_dir` theirs), `executor.num_kv_blocks` sizing their shared pool in the
    #: costliest model's blocks. Empty: one model, `executor.model_dir`.
    models: list[MuxModelConfig] = []
    #: A file to write one record per step to (engines/step_log.py); "" = none.
    step_log: str = ""

    @property
    def resolved_role(self) -> Role:
        return self.role if self.role is not None else role_of_mode(self.scheduler.mode)

    def to_json(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def from_json(cls, text: str | bytes) -> "InstanceConfig":
        """Decode and validate; raises ValueError naming the bad field."""
        try:
            config = msgspec.json.decode(text, type=cls)
        except msgspec.DecodeError as exc:
            raise ValueError(f"instance config: {exc}") from None
        return config.validate()

    def validate(self) -> "InstanceConfig":
        """Checks that span fields; raises ValueError."""
        if not self.endpoint.startswith("ipc://"):
            raise ValueError(f"instance config: endpoint must be ipc://, got {self.endpoint!r}")
        self.scheduler.validate()
        return self
