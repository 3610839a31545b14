"""The controller core's settings: default SLOs, routing, admission bounds, recovery.

msgspec structs with their defaults and descriptions written once, here; `ascendra serve`
(TOML sections [slo] and [controller], flags), the simulator and the tests all use them.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from policies.global_queue import Shed
from policies.roles import FAIR_BURST_HP_SHARE, RoleParams
from policies.routing import Routing

#: The burst test's defaults, named in `hps_in_bursts`'s description.
_ROLES = RoleParams()

PositiveInt = Annotated[int, Meta(ge=1)]


class EspSettings(msgspec.Struct, frozen=True, kw_only=True):
    """ESP groups (daemon/core/esp_groups.py): `max_degree`: the largest group (1: ESP
    off); `min_tokens`: split every prompt of at least this many tokens (0: only those
    predicted to miss their deadline alone)."""

    max_degree: int = 1
    min_tokens: int = 0


_ESP = EspSettings()


class SloConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A request's latency targets when it names none (the paper's ShareGPT settings)."""

    ttft_slo: Annotated[float, Meta(gt=0, description=(
        "Default time-to-first-token target, seconds (a request may set ttft_slo, or the "
        "x-llm-d-slo-ttft-ms header)."))] = 1.0
    tbt_slo: Annotated[float, Meta(gt=0, description=(
        "Default mean time-between-tokens target, seconds (a request may set tbt_slo, or "
        "the x-llm-d-slo-tpot-ms header)."))] = 0.15


class ControllerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How the controller routes, and the bounds that keep its memory and patience finite
    under any load."""

    routing: Annotated[Routing, Meta(description=(
        'How a new request picks among peer instances after any open HP ticket: '
        '"prefix_aware" (the one holding the longest cached prefix of its prompt while its '
        'load allows, else the least loaded), "least_loaded" (fewest requests in flight) or '
        '"round_robin". The same rule serves the LP pool of an Ascendra layout (with the '
        "global queue, prefix_aware binds a request to the LP holding most of its prompt "
        "while that LP would still prefill it in time, else to the one that would finish "
        "its prefill first) and every instance of a baseline one."
        ))] = Routing.PREFIX_AWARE
    global_queue: Annotated[bool, Meta(description=(
        "Ascendra layouts: new requests wait at the controller and an LP instance takes the "
        "next one only when its predicted prefill backlog falls under two steps' worth "
        "(late binding; policies/global_queue.py). Off: each request goes to an LP on "
        "arrival (the paper's routing)."))] = True
    bind_steps: Annotated[float, Meta(gt=0, description=(
        "With the global queue, an LP instance takes more requests while its queued prompt "
        "tokens are under this many of its steps' token budgets."))] = 2.0
    hp_gate: Annotated[bool, Meta(description=(
        "With the global queue, a request goes to an HP instance (an LP's offload, or one "
        "the LPs cannot serve in time) only when that HP is predicted to finish its prefill "
        "before its deadline. Off: offloads go to the HP with the shortest queue whatever "
        "its backlog, and the controller rescues nothing itself (the paper's rule; for "
        "ablations)."))] = True
    shed: Annotated[Shed, Meta(description=(
        "With the global queue, what becomes of requests predicted to miss their TTFT SLO "
        'on every instance: "drop" ends them at once (503 ttft_slo_missed, Retry-After), '
        '"demote" serves them after every request that can still make it, "keep" leaves '
        "them in deadline order."))] = Shed.DROP
    miss_budget: Annotated[float, Meta(ge=0.0, le=1.0, description=(
        'With shed = "drop": the most requests the controller may drop as predicted misses, '
        "as a share of those that arrived in the last minute; past it, the costliest late "
        "requests are still dropped first and the rest are demoted (served after every "
        "request that can still make it). 1 = no limit, 0 = never drop (as demote)."
        ))] = 1.0
    class_floor: Annotated[float, Meta(ge=0.0, le=1.0, description=(
        "With the global queue, fairness-aware shedding: requests are split into prompt-"
        "length quartiles of the recent arrivals, and a class whose recent requests met "
        "their TTFT target less often than this share (plus 5 points) is protected: the "
        "triage sets aside and drops requests of other classes instead, and plans each "
        "request on the LP that frees up first rather than on the pooled LPs. With an <n>A "
        "layout, while arrivals come in bursts (see hps_in_bursts), it protects no class and "
        f"keeps up to {Fraction(FAIR_BURST_HP_SHARE).limit_denominator(12)} of the instances "
        "as HPs instead. Fair capacity rises, capacity under the plain 90 % rule falls "
        "(docs/fairness.md). 0 = the paper's rule (the costliest late request goes first, "
        "whoever it is)."))] = 0.0
    class_floor_by: Annotated[Literal["prompt", "slo"], Meta(description=(
        "What class_floor's classes are: \"prompt\", the prompt-length quartiles; \"slo\", "
        "the requests' TTFT targets (SLO classes: while a class is under the floor its "
        "requests are served first on their instance, and other classes' requests are set "
        "aside and dropped first; policies/slo_class_floor.py)."))] = "prompt"
    hps_in_bursts: Annotated[bool, Meta(description=(
        f"With an <n>A layout: while arrivals come in bursts (over "
        f"{_ROLES.burst_horizon:g} s, a mean gap at least {_ROLES.burst_ratio:g} times the "
        f"median one), keep up to {Fraction(_ROLES.burst_hp_share).limit_denominator(12)} of "
        "the instances (rounded up; with a class_floor, "
        f"{Fraction(FAIR_BURST_HP_SHARE).limit_denominator(12)}) as HPs even with one SLO "
        "class. Their deadline order serves the longest prompts a burst would otherwise "
        "refuse: every prompt-length quartile keeps 80 % up to a higher load (fair "
        "capacity), at a little capacity under the plain 90 % rule (docs/design.md §5.10 "
        "gives both). Off: HPs only for mixed SLO classes, the paper's rule."
        ))] = _ROLES.hps_in_bursts
    max_wait_slo_multiple: Annotated[float, Meta(gt=0, description=(
        "A request without a first token after this many times its TTFT SLO ends with 503 "
        "ttft_slo_missed -- waiting at the controller, or (with the global queue) held by "
        "an instance, which is told to abort it: nothing waits without an answer for "
        "ever."))] = 10.0
    max_queued_requests: Annotated[PositiveInt, Meta(description=(
        "Bounded waiting: at most this many accepted requests may wait for a first token; a "
        "request beyond it gets 503 with Retry-After (counted in "
        'ascendra_dropped_total{reason="queue_full"}), so memory stays bounded. vLLM\'s '
        "--max-num-queued-reqs sets it too."))] = 1024
    max_queued_tokens: Annotated[PositiveInt, Meta(description=(
        "... and those waiting requests may hold at most this many prompt tokens in all; "
        "beyond: 503 as above (vLLM's --max-num-queued-tokens sets it too)."))] = 1 << 20
    recovery_timeout: Annotated[float, Meta(ge=0, description=(
        "Seconds the requests of an instance that died may wait for another instance (or "
        "the restarted one) to take them over -- resubmitted, or resumed mid-stream by "
        "recompute -- before they end with a 503 / SSE error event; 0 = end them at once "
        "when none is ready."))] = 10.0
    esp_max_degree: Annotated[PositiveInt, Meta(description=(
        "Elastic sequence parallelism (LoongServe): the most instances one long prompt's "
        "prefill may be striped over (an ESP group; docs/elastic_sequence_parallelism.md). "
        "The group's first instance, its master, then holds the prompt's whole KV (the "
        "others' stripes are gathered to it once) and decodes the request. Peer or "
        "Ascendra instances only (never a P/D layout's); sim executors at any tp, the torch "
        "executor at tp 1 on CPU. "
        "1 = off."))] = _ESP.max_degree
    esp_min_tokens: Annotated[int, Meta(ge=0, description=(
        "With esp_max_degree > 1: every prompt of at least this many tokens is prefilled "
        "by an ESP group; 0 = only the prompts one instance is predicted to prefill too "
        "late for their TTFT target."))] = _ESP.min_tokens

    @property
    def esp(self) -> EspSettings:
        return EspSettings(max_degree=self.esp_max_degree, min_tokens=self.esp_min_tokens)


TenantWeight = Annotated[float, Meta(gt=0)]


class TenantsConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Who is asking: a request's tenant is its x-llm-d-inference-fairness-id header (or
    the old x-gateway-inference-fairness-id), else the body's `user`, else "default"
    (docs/design.md §5.11). Under saturation the waiting room shares service among the
    tenants with requests in it by weight; without saturation tenants change nothing."""

    fair_share: Annotated[bool, Meta(description=(
        "With the global queue, when requests would miss their targets each tenant gets "
        "service (prompt and output tokens computed) in proportion to its weight: the "
        "triage sets aside and sheds requests of the tenants furthest over their share "
        "first (after sheddable traffic, priority < 0). Off: the costliest late request "
        "goes first, whoever sent it."))] = True
    tenant_weights: Annotated[dict[str, TenantWeight], Meta(description=(
        'Each tenant\'s weight (TOML: tenant_weights = {"team-a" = 2, "team-b" = 1}; flag: '
        "--tenant-weights team-a=2,team-b=1); a tenant not named weighs 1."))] = {}
    objective_priorities: Annotated[dict[str, int], Meta(description=(
        "The priority of each Gateway API Inference Extension objective (the "
        "x-llm-d-inference-objective header, or the old x-gateway-inference-objective, "
        "names one), as its InferenceObjective's priority; a request's own priority (body "
        "or x-ascendra-priority header) wins."
        ))] = {}
    metrics_tenants: Annotated[int, Meta(ge=0, le=1000, description=(
        "/metrics labels per-tenant series with the tenants that sent the most requests, "
        'at most this many; the rest count as tenant="other" (bounded cardinality).'
        ))] = 10
