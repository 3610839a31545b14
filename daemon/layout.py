"""Layouts: how many engine instances of which mode, and which GPUs each one gets.

`3xsarathi` is three Sarathi-Serve instances, `1xvllm-v1` one instance scheduling as vLLM
V1 does (`vllm-v0`, `sglang`: the other baselines, docs/baselines.md; `vllm` is
`vllm-v0`'s deprecated name);
`2L1H` is Ascendra's two low-priority (LP) and one high-priority (HP) instance,
and any `<n>L<m>H` works the same way. `<n>A` (`3A`, `8A`) is n Ascendra instances whose
roles the controller chooses online, each LP or HP at any moment (docs/design.md §5.10):
they start as LPs. `<n>P<m>D` (`1P1D`, `2P1D`, `1P2D`, ...) is
DistServe's prefill/decode disaggregation: n prefill instances run prompts to the first
token and hand each request, KV cache and all, to one of m decode instances.
"""
from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass

from engines.modes import ALIASES, MODES

log = logging.getLogger(__name__)

_REPEAT = re.compile(r"^(\d+)x([a-z][a-z0-9-]*)$")
_ASCENDRA = re.compile(r"^(\d+)L(\d+)H$")
_DISAGGREGATED = re.compile(r"^(\d+)P(\d+)D$")
_ADAPTIVE = re.compile(r"^(\d+)A$")
#: Modes that only make sense together, in a `<n>P<m>D` layout.
_PD_MODES = ("prefill", "decode")


@dataclass(frozen=True)
class InstanceSpec:
    index: int
    mode: str
    gpus: tuple[int, ...]  # empty: CPU

    @property
    def name(self) -> str:
        return f"{self.mode}-{self.index}"


def parse_layout(layout: str, gpus: list[int] | None = None, gpus_per_instance: int = 1,
                 ) -> list[InstanceSpec]:
    """Expand a layout string; GPUs are dealt out in order, `gpus_per_instance` each."""
    modes = layout_modes(layout)
    if gpus:
        need = len(modes) * gpus_per_instance
        if len(gpus) < need:
            raise ValueError(f"layout: {layout!r} needs {need} GPUs, gpus lists {len(gpus)}")
    return [
        InstanceSpec(i, mode, tuple(gpus[i * gpus_per_instance:(i + 1) * gpus_per_instance])
                     if gpus else ())
        for i, mode in enumerate(modes)
    ]


def layout_modes(layout: str) -> list[str]:
    """The mode of each instance, in instance-id order (LP instances before HP ones)."""
    text = layout.strip()
    if match := _ADAPTIVE.match(text):
        if int(match.group(1)) < 1:
            raise ValueError(f"layout: {layout!r} has no instances")
        return ["lp"] * int(match.group(1))
    if match := _ASCENDRA.match(text):
        lp, hp = int(match.group(1)), int(match.group(2))
        if lp < 1 or hp < 0:
            raise ValueError(f"layout: {layout!r} needs at least one LP instance")
        return ["lp"] * lp + ["hp"] * hp
    if match := _DISAGGREGATED.match(text):
        prefill, decode = int(match.group(1)), int(match.group(2))
        if prefill < 1 or decode < 1:
            raise ValueError(f"layout: {layout!r} needs at least one prefill (P) and one "
                             "decode (D) instance")
        return ["prefill"] * prefill + ["decode"] * decode
    match = _REPEAT.match(text)
    if not match:
        raise ValueError(f"layout: cannot read {layout!r}; write it as <count>x<mode> "
                         f"(e.g. 3xsarathi), <n>L<m>H (e.g. 2L1H), <n>A (e.g. 3A: roles "
                         f"chosen online) or <n>P<m>D (e.g. 2P1D)")
    count, mode = int(match.group(1)), _current_name(match.group(2))
    if mode in _PD_MODES:
        raise ValueError(f"layout: {mode} instances come in pairs with the other kind; "
                         f"write <n>P<m>D (e.g. 1P1D), not {layout!r}")
    if mode not in MODES:
        raise ValueError(f"layout: unknown mode {mode!r} in {layout!r}; modes: "
                         f"{sorted(MODES)}")
    if count < 1:
        raise ValueError(f"layout: {layout!r} has no instances")
    return [mode] * count


#: `instances.layout`'s default: Ascendra's own, one instance per GPU listed (`default_layout`).
DEFAULT_LAYOUT = ""


def default_layout(gpus: list[int] | None, gpus_per_instance: int = 1, models: int = 1) -> str:
    """The layout a plain `ascendra serve` runs: `<n>A`, Ascendra's instances choosing
    their roles online, n = the instances the listed GPUs make for each model (no GPUs
    listed: 1, so `1A`, one instance in the LP role -- it orders waiting prompts by
    deadline). A baseline or a fixed split is asked for by name (`--layout 3xsarathi`,
    `2L1H`)."""
    instances = len(gpus) // gpus_per_instance // models if gpus else 1
    return f"{max(1, instances)}A"


def dynamic_roles(layout: str) -> bool:
    """Its instances change between LP and HP online (`<n>A`)."""
    return bool(_ADAPTIVE.match(layout.strip()))


@functools.cache
def _current_name(mode: str) -> str:
    """`mode`, or the mode an old name stands for (said once per process)."""
    if mode in ALIASES:
        log.warning("layout: mode %r is deprecated; it now runs as %r (docs/baselines.md)",
                    mode, ALIASES[mode])
    return ALIASES.get(mode, mode)

