"""`ascendra reproduce results --profile FILE|NAME`: docs/results.md's tables on another
profile (a file `ascendra profile` measured, or a built-in name), aimed as the A100 tables
are aimed.

The tables were set for `a100-llama3-8b` (REFERENCE): their SLOs, and the rates of the
studies that run at fixed rates (overload's and tenants' capacity C, the live check's
points) and the capacity searches' starting points. On another profile:

* **SLOs**: the profile's own, from the one source (daemon/slo_defaults.py, `--slo-scale
  auto`, engines/executors/profiles/slo_scale.py): a model that fits one GPU, and a
  measured file, keep the paper's; a 70B's are scaled up.
* **Rates**: every fixed rate times the profile's **rate scale**, the one rule: the
  profile's ceiling over REFERENCE's on the same workload (bench/ruler/ceiling.py
  `cheapest_qps`: poisson ShareGPT, three instances, the 90 % goodput target, each
  profile at its own SLOs and context limit), so that each point sits at the same
  fraction of that profile's capacity bound as on the A100. The ceiling is a bound from
  the profile's step times and KV cache (a fluid model, no queueing), not a searched
  capacity; a search costs minutes and its noise would move every rate.
* **Context limit**: a measured file's `max_model_len`, when below the tables' 8,192
  (its model cannot take longer requests: the workload is fitted into it).

Every table's stamp then names the profile, the SLO scale and the rate scale
(`ProfileTarget`); the capacity tables' rows are `ascendra capacity ... --profile P`.
"""
from __future__ import annotations

import re
from pathlib import Path

import msgspec

from bench.ruler.ceiling import workload_ceilings
from bench.ruler.ruler import RulerConfig
from bench.sim.sim_flags import sim_settings
from bench.studies.results_tables import capacity_parser
from engines.executors.profiles.registry import get_profile
from engines.executors.profiles.slo_scale import SloScale

#: The profile the tables were set for.
REFERENCE = "a100-llama3-8b"
#: The instances the rate scale's ceilings are taken over (the tables' boxes: 3A, 2L1H).
INSTANCES = 3


class ProfileTarget(msgspec.Struct, frozen=True, kw_only=True):
    """A reproduce run on another profile: what it changed, and why (each table's stamp)."""
    profile: str
    description: str
    slo_scale: SloScale
    #: every fixed rate's factor: `ceiling_qps` over `reference_ceiling_qps`
    rate_scale: float
    ceiling_qps: float
    reference_ceiling_qps: float
    #: the rows' and studies' context limit, when below the tables' (a measured file's)
    max_model_len: int | None = None

    def study_flags(self, flags: str, default_capacity: float | None = None) -> str:
        """A study's flags on this profile: its rates scaled (`default_capacity`: the
        study's own `--capacity` when its flags do not name one), the profile's flags added."""
        if default_capacity is not None and not _CAPACITY.search(flags):
            flags = f"{flags} --capacity {default_capacity:g}".strip()
        flags = _CAPACITY.sub(lambda m: f"--capacity {self.rate(float(m[1])):g}", flags)
        flags = _POINTS.sub(lambda m: "--points " + ",".join(
            f"{w}:{self.rate(float(q)):g}" for w, q in (p.split(":") for p in m[1].split(","))),
            flags)
        return f"{flags} {self.flags()}".strip()

    def flags(self) -> str:
        """What a capacity row or a study adds to run on this profile."""
        limit = f" --max-model-len {self.max_model_len}" if self.max_model_len else ""
        return f"--profile {self.profile}{limit}"

    def rate(self, qps: float) -> float:
        """A rate set on REFERENCE, at the same fraction of this profile's ceiling."""
        return round(qps * self.rate_scale, 3)

    def describe(self) -> str:
        """The stamp's line."""
        limit = (f"; requests fitted into {self.max_model_len:,} tokens, the profile's "
                 "context limit" if self.max_model_len else "")
        return (f"**On profile `{self.profile}`** ({self.description}): {self.slo_scale.describe()}; "
                f"fixed rates x{self.rate_scale:g} (its poisson ShareGPT ceiling on "
                f"{INSTANCES} instances, {self.ceiling_qps:g} QPS, over {REFERENCE}'s, "
                f"{self.reference_ceiling_qps:g}){limit}.")


def profile_target(profile: str) -> ProfileTarget:
    """The target of a run on `profile` (a built-in name or a profile file); ValueError
    naming the profile when it cannot be read."""
    loaded = get_profile(profile)  # "profile file 'x.json' is malformed: ..."
    if Path(profile).is_file():  # the studies run from the repository's root
        profile = str(Path(profile).absolute())
    limit = getattr(getattr(loaded, "data", None), "max_model_len", None)
    limit = limit if limit is not None and limit < RulerConfig().max_model_len else None
    own, reference = _ceiling(profile, limit), _ceiling(REFERENCE, None)
    if own[0] <= 0:
        raise ValueError(f"profile {profile!r}: no rate fits its SLOs on poisson ShareGPT "
                         "(its ceiling is 0), so the tables' rates cannot be scaled to it")
    return ProfileTarget(profile=profile, description=getattr(loaded, "description", ""),
                         slo_scale=own[1], rate_scale=round(own[0] / reference[0], 4),
                         ceiling_qps=own[0], reference_ceiling_qps=reference[0],
                         max_model_len=limit)


def _ceiling(profile: str, max_model_len: int | None) -> tuple[float, SloScale]:
    """The profile's poisson ShareGPT ceiling (90 % served) at its own SLOs, and the SLO
    scale, read through `ascendra capacity`'s own flags."""
    argv = ["--workload", "poisson", "--profile", profile]
    argv += ["--max-model-len", str(max_model_len)] if max_model_len else []
    _, config = sim_settings(capacity_parser().parse_args(argv))
    return workload_ceilings(config, INSTANCES).cheapest_qps, config.slo_scale


#: A study's flags that carry rates set on REFERENCE: `--capacity C`, `--points w:Q,...`.
_CAPACITY = re.compile(r"--capacity (\S+)")
_POINTS = re.compile(r"--points (\S+)")
