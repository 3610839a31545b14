"""Tenants of a workload: who sends each request (`--tenant-mix`).

`--tenant-mix NAME=SHARE[:WEIGHT[:PRIORITY]],...` gives each tenant its share of the
arrivals (shares are normalised: `a=3,b=1` is 75 % and 25 %), its fair-share weight
(default 1; the simulator hands the weights to the controller as `[tenants]
tenant_weights`, which a run's own `--tenant-weights` overrides tenant by tenant) and its
priority (default 0; negative = sheddable, the daemon takes -100..100).

Each arrival draws its tenant with a seeded generator of its own (`assign_tenants`): the
same seed gives the same tenants, and a mix changes neither the arrival times nor the
lengths of a run (they come from other streams), so a run with a mix and one without
send the same requests. A live run (bench/loadgen/loadgen.py) sends the tenant as the
header `x-gateway-inference-fairness-id` and the priority in the body.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
import numpy as np

from ipc.tenancy import MAX_PRIORITY, MIN_PRIORITY

__all__ = ["FLAG", "TenantShare", "assign_tenants",
           "check_tenant_mix", "mix_text", "parse_tenant_mix", "tenant_rates", "tenant_weights"]

FLAG = "--tenant-mix"
#: The seed stream of the tenant draw: apart from arrivals, lengths, prompts and classes.
TENANT_STREAM = 7


class TenantShare(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    tenant: str
    share: float          # of the arrivals, 0..1 (normalised)
    weight: float = 1.0   # its fair-share weight
    priority: int = 0     # < 0: sheddable


def parse_tenant_mix(text: str) -> tuple[TenantShare, ...]:
    """'heavy=3,light=1:2:-1' -> tenants with normalised shares; ValueError naming the
    flag and the part at fault."""
    def bad(why: str) -> ValueError:
        return ValueError(f"{FLAG} {text!r}: {why}; give NAME=SHARE[:WEIGHT[:PRIORITY]],... "
                          f"e.g. heavy=0.75,light=0.25:2 or batch=0.5:1:-1,chat=0.5")

    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise bad("no tenants")
    mix: list[TenantShare] = []
    for part in parts:
        name, sep, rest = part.partition("=")
        name = name.strip()
        if not sep or not name:
            raise bad(f"{part!r} is not NAME=SHARE[:WEIGHT[:PRIORITY]]")
        if any(c.isspace() or not c.isprintable() for c in name):
            raise bad(f"tenant name {name!r} has spaces or unprintable characters")
        fields = rest.split(":")
        if len(fields) > 3:
            raise bad(f"{part!r} has more than SHARE:WEIGHT:PRIORITY")
        try:
            share = float(fields[0])
            weight = float(fields[1]) if len(fields) > 1 else 1.0
        except ValueError:
            raise bad(f"the share or weight of {name} in {part!r} is not a number") from None
        try:
            priority = int(fields[2]) if len(fields) > 2 else 0
        except ValueError:
            raise bad(f"the priority of {name} in {part!r} is not an integer") from None
        mix.append(TenantShare(name, share, weight, priority))
    try:
        check_tenant_mix(mix)
    except ValueError as exc:
        raise bad(str(exc)) from None
    total = sum(t.share for t in mix)
    return tuple(msgspec.structs.replace(t, share=t.share / total) for t in mix)


def check_tenant_mix(mix: Sequence[TenantShare]) -> None:
    """ValueError saying what is wrong with a mix (names once each, shares > 0, ...)."""
    names = [t.tenant for t in mix]
    if not mix:
        raise ValueError("a tenant mix needs at least one tenant")
    if len(set(names)) < len(names):
        raise ValueError(f"a tenant is named twice: {names}")
    for t in mix:
        if not t.tenant:
            raise ValueError("a tenant's name is empty")
        if not (t.share > 0 and math.isfinite(t.share)):
            raise ValueError(f"the share of {t.tenant} must be > 0, got {t.share:g}")
        if not (t.weight > 0 and math.isfinite(t.weight)):
            raise ValueError(f"the weight of {t.tenant} must be > 0, got {t.weight:g}")
        if not MIN_PRIORITY <= t.priority <= MAX_PRIORITY:
            raise ValueError(f"the priority of {t.tenant} must be in [{MIN_PRIORITY}, "
                             f"{MAX_PRIORITY}], got {t.priority}")


def assign_tenants(mix: Sequence[TenantShare], n: int, seed: int) -> list[TenantShare]:
    """The tenant of each of `n` arrivals, drawn by share from a stream of `seed`'s own."""
    shares = np.array([t.share for t in mix], dtype=float)
    picks = np.random.default_rng([seed, TENANT_STREAM]).choice(len(mix), size=n,
                                                                p=shares / shares.sum())
    return [mix[i] for i in picks]


def tenant_rates(mix: Sequence[TenantShare], qps: float) -> dict[str, float]:
    """Each tenant's mean arrival rate at `qps` in all (its share x qps)."""
    total = sum(t.share for t in mix)
    return {t.tenant: qps * t.share / total for t in mix}


def tenant_weights(mix: Sequence[TenantShare] | None) -> dict[str, float]:
    return {t.tenant: t.weight for t in mix or ()}


def mix_text(mix: Sequence[TenantShare], qps: float | None = None) -> str:
    """One line per run's configuration: each tenant's share (and rate at `qps`), weight
    and priority."""
    rates = tenant_rates(mix, qps) if qps is not None and math.isfinite(qps) else {}
    total = sum(t.share for t in mix)
    parts = []
    for t in mix:
        rate = f" {rates[t.tenant]:.2f} req/s" if t.tenant in rates else ""
        sheddable = " (sheddable)" if t.priority < 0 else ""
        parts.append(f"{t.tenant}{rate} ({100 * t.share / total:.1f} %, weight {t.weight:g}, "
                     f"priority {t.priority}{sheddable})")
    return "tenants: " + "; ".join(parts)
