"""A model's default SLOs: the [slo] defaults times the model's SLO scale.

The one source for `serve` (its sim executor's profile, `instances.slo_scale`) and the
simulator's commands (`simulate`, `capacity`, `plan`: `--profile`, `--slo-scale`,
bench/sim/sim_flags.py): the factors are engines/executors/profiles/slo_scale.py's (1 for
a model that fits one GPU, so every one-GPU box keeps the paper's SLOs), and a target the
operator set (`--ttft-slo`, `[slo] ttft_slo = ...`) is kept as given.
"""
from __future__ import annotations

import msgspec

from daemon.core.controller_config import SloConfig
from engines.executors.profiles.slo_scale import SloScale, parse_slo_scale

#: `--slo-scale`'s default, in `serve` and in the simulator's commands alike.
DEFAULT_SLO_SCALE = "auto"
#: What the setting takes (its help, beside the default).
SLO_SCALE_HELP = (
    'factors on the default SLOs (ttft_slo / tbt_slo when not set, and the workloads\' SLO '
    'classes): "auto" = the model\'s own, from its isolated latency on its profile (1 for a '
    "model that fits one GPU; engines/executors/profiles/slo_scale.py), \"X\" = both, "
    '"TTFT,TBT" = each')


def scaled_slo(slo: SloConfig, scale: SloScale, given: set[str]) -> SloConfig:
    """`slo` with the defaults times `scale`; a target named in `given` (set by a flag or
    the config file) kept."""
    if (scale.ttft, scale.tbt) == (1.0, 1.0):
        return slo
    changes = {"ttft_slo": round(slo.ttft_slo * scale.ttft, 6),
               "tbt_slo": round(slo.tbt_slo * scale.tbt, 6)}
    return msgspec.structs.replace(slo, **{k: v for k, v in changes.items() if k not in given})


def latency_slo_scale(latency: str, text: str = DEFAULT_SLO_SCALE) -> SloScale:
    """The scale `text` (the setting) gives a sim executor's step latency spec: "auto" is
    a `profile:NAME`'s own (a 70B's > 1; "zero", "constant:X", a measured profile file and
    the torch executor have no profile to scale by: 1), "X" and "TTFT,TBT" are taken as
    given; ValueError naming the setting when `text` is not one of those."""
    profile = latency.split(":", 1)[1] if latency.startswith("profile:") else ""
    try:
        return parse_slo_scale(text, profile)
    except ValueError as exc:
        raise ValueError(f"instances.slo_scale: {exc}".replace("--slo-scale ", "")) from None
