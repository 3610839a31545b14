"""The capacity ruler: one layout's steady-state capacity on one workload, per seed.

The protocol (stated in full by `RulerConfig` and printed with every result):

* **steady state** -- each simulated point runs `MeasureRule.requests_for(measured)`
  requests (5,625 for 4,500 measured), after a workload's priming requests if it has any,
  and is judged on the measured middle only, overall and per window
  (bench/ruler/steady_state.py);
* **the same routing for every layout** -- `routing` applies to the LP pool of an
  Ascendra layout and to every instance of a baseline (policies/router.py), by
  construction: there is one field for both;
* **several seeds** -- each seed draws its own arrivals and lengths and gets its own
  capacity search; a result reports the mean, min and max over seeds;
* **capacity** -- the highest rate that holds the target (bench/ruler/capacity.py), searched
  from a start near the hardware ceiling (bench/ruler/ceiling.py), to `tolerance`;
* **fair capacity** -- the highest rate that holds it with every request class
  (bench/records/request_classes.py: prompt-length quartiles, SLO classes) at `fair_floor` too,
  searched from the capacity down (it is never above it: the rule is stricter).
"""
from __future__ import annotations

import time
from collections.abc import Callable

import msgspec

from bench.loadgen.tenant_mix import tenant_weights
from bench.loadgen.workload import WorkloadRequest
from bench.loadgen.workloads import WorkloadSpec, build_requests
from bench.records.schema import RecordRow
from bench.records.records_file import record_rows
from bench.ruler.capacity import CAPACITY_TARGET, bisect_edge, find_capacity
from bench.records.request_classes import DEFAULT_FAIR_FLOOR, ClassGoodput, RequestClasses
from bench.ruler.steady_state import MeasureRule, judge, misses_allowed
from bench.sim.sim_instances import SimConfig
from bench.sim.simulator import Simulation
from daemon.core.controller_config import ControllerConfig, SloConfig, TenantsConfig
from daemon.layout import dynamic_roles, layout_modes
from engines.scheduler_config import SchedulerConfig
from engines.executors.profiles.slo_scale import SloScale
from policies.routing import Routing


#: The search steps up or down from its start by this factor until it brackets the edge:
#: from the hardware ceiling, a wide step; from another seed's capacity, a narrow one.
START_GROWTH = 1.25
NEAR_GROWTH = 1.05


class SearchSteps(msgspec.Struct, frozen=True, kw_only=True):
    """How far one seed's searches may go: the ruler's (the defaults), or a first look's."""
    max_runs: int = 16           # rates tried for the capacity
    fair_growth: float = START_GROWTH
    fair_max_runs: int = 16      # rates tried for the fair capacity (the capacity's reused)


class Subject(msgspec.Struct, frozen=True, kw_only=True):
    """One layout at its settings (e.g. 3xsarathi at chunk 1024), as a row of a table."""
    label: str
    layout: str
    scheduler: SchedulerConfig = SchedulerConfig()
    #: A baseline's own routing, when it differs from the table's (`RulerConfig.controller`):
    #: a baseline at its best tuning may route round-robin where the table does not.
    routing: Routing | None = None


class RulerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a capacity depends on but the layout and its scheduler (`Subject`)."""
    workload: WorkloadSpec = WorkloadSpec()
    profile: str = "a100-llama3-8b"
    slo: SloConfig = SloConfig()
    #: The factors `slo` and the workload's SLO classes carry over the defaults (the
    #: model's, engines/executors/profiles/slo_scale.py); a record of them, applied already.
    slo_scale: SloScale = SloScale()
    #: Routing, the global queue and shedding: one choice for every layout of a table.
    controller: ControllerConfig = ControllerConfig()
    #: Tenants' fair shares ([tenants]); a workload's tenant mix adds its weights
    #: (`effective_tenants`).
    tenants: TenantsConfig = TenantsConfig()
    measured: int = 4500
    seeds: tuple[int, ...] = (0, 1, 2)
    target: float = CAPACITY_TARGET
    tolerance: float = 0.03
    rule: MeasureRule = MeasureRule()
    max_model_len: int = 8192
    latency: str = ""                  # SimConfig.latency: "" = the profile's step times
    num_kv_blocks: int | None = None
    interconnect: str = ""             # SimConfig.interconnect: a P/D layout's KV link
    #: Fair capacity: every class's goodput must reach this share too (0: no floor).
    fair_floor: float = DEFAULT_FAIR_FLOOR

    def __post_init__(self) -> None:
        if not 0.0 <= self.fair_floor <= 1.0:
            raise ValueError(f"fair_floor must be in [0, 1], got {self.fair_floor}")


class Point(msgspec.Struct, frozen=True):
    """One simulated rate of one seed."""
    qps: float
    holds: bool
    goodput_pct: float          # measured requests (over those finished, if stopped early)
    window_goodput_pct: list[float]
    stopped_early: bool         # failed before the end: too many measured misses already
    offloaded: int
    dropped: int
    wall_s: float
    classes: list[ClassGoodput] = []
    fair_holds: bool = False    # holds, and every class at the floor
    token_goodput_pct: float = 0.0


class SeedCapacity(msgspec.Struct, frozen=True):
    seed: int
    capacity_qps: float
    points: list[Point]
    #: The search found the edge: a rate held and a higher one failed. False: every rate
    #: tried held (the capacity is only a lower bound) or none did.
    bracketed: bool = True
    fair_capacity_qps: float = 0.0
    fair_bracketed: bool = True


def ruler_classes(config: RulerConfig) -> RequestClasses:
    """The workload's classes, from its first seed's requests (the same for every rate,
    layout and seed of a table; a rate changes arrivals, not lengths)."""
    return RequestClasses.from_prompts(
        [r.prompt_len for r in workload_requests(config, 1.0, config.seeds[0]) if not r.warmup])


def effective_tenants(config: RulerConfig) -> TenantsConfig:
    """`config.tenants` with the weights of the workload's tenant mix, each unless
    `tenants.tenant_weights` (the run's --tenant-weights) names its tenant."""
    mix = tenant_weights(config.workload.tenant_mix)
    if not mix:
        return config.tenants
    return msgspec.structs.replace(config.tenants,
                                   tenant_weights={**mix, **config.tenants.tenant_weights})


def sim_config(subject: Subject, config: RulerConfig) -> SimConfig:
    controller = config.controller
    if subject.routing is not None:
        controller = msgspec.structs.replace(controller, routing=subject.routing)
    return SimConfig(layout_modes=tuple(layout_modes(subject.layout)), profile=config.profile,
                     scheduler=subject.scheduler, slo=config.slo, controller=controller,
                     tenants=effective_tenants(config),
                     max_model_len=config.max_model_len, latency=config.latency,
                     num_kv_blocks=config.num_kv_blocks, interconnect=config.interconnect,
                     dynamic_roles=dynamic_roles(subject.layout), esp=controller.esp)


def workload_requests(config: RulerConfig, qps: float, seed: int) -> list[WorkloadRequest]:
    return build_requests(config.workload, rate=qps,
                          num_requests=config.rule.requests_for(config.measured), seed=seed,
                          max_model_len=config.max_model_len)


def run_point(subject: Subject, config: RulerConfig, qps: float, seed: int,
              classes: RequestClasses | None = None) -> Point:
    """Simulate one rate and judge it by the steady-state rule (stopping early once it
    cannot hold), per class of `classes` too (default: the workload's)."""
    started = time.perf_counter()
    requests = workload_requests(config, qps, seed)
    primed = sum(r.warmup for r in requests)
    simulation = Simulation(sim_config(subject, config), requests,
                            watched=range(*config.rule.span(len(requests), primed)))
    records = simulation.run(give_up_after=misses_allowed(len(requests), config.target,
                                                          config.rule, primed))
    verdict = judge([r for r in records if r.outcome != "lost"] if simulation.stopped_early
                    else records, config.target, config.slo.ttft_slo, config.slo.tbt_slo,
                    config.rule, classes or ruler_classes(config), config.fair_floor)
    holds = verdict.holds and not simulation.stopped_early
    return Point(qps=qps, holds=holds,
                 goodput_pct=round(verdict.goodput_pct, 2),
                 window_goodput_pct=[round(w, 2) for w in verdict.window_goodput_pct],
                 stopped_early=simulation.stopped_early,
                 offloaded=sum(r.offloaded for r in records),
                 dropped=sum(r.outcome == "dropped" for r in records),
                 wall_s=round(time.perf_counter() - started, 2), classes=verdict.classes,
                 fair_holds=holds and verdict.fair_holds,
                 token_goodput_pct=round(verdict.token_goodput_pct, 2))


def point_rows(subject: Subject, config: RulerConfig, qps: float, seed: int) -> list[RecordRow]:
    """One rate simulated to the end: every request's records row, the steady-state
    window's marked `measured` (what `--records` writes for a point)."""
    records = Simulation(sim_config(subject, config),
                         workload_requests(config, qps, seed)).run()
    return record_rows(records, config.slo.ttft_slo, config.slo.tbt_slo,
                       config.rule.measured(records))


def seed_capacity(subject: Subject, config: RulerConfig, seed: int,
                  start_qps: float, growth: float = START_GROWTH,
                  steps: SearchSteps = SearchSteps()) -> SeedCapacity:
    """Capacity, then fair capacity searched down from it (a rate run once is not run
    again: both searches read the same points); `steps` bounds the searches (a first
    look takes fewer, wider ones)."""
    points: dict[float, Point] = {}
    classes = ruler_classes(config)

    def point(qps: float) -> Point:
        if qps not in points:
            points[qps] = run_point(subject, config, qps, seed, classes)
        return points[qps]

    capacity = find_capacity(lambda q: point(q).holds, start_qps=start_qps,
                             tolerance=config.tolerance, growth=growth,
                             max_runs=steps.max_runs)
    fair = capacity if config.fair_floor == 0 or capacity == 0 else _fair_capacity(
        point, points, capacity, config.tolerance, steps)
    tried = sorted(points.values(), key=lambda p: p.qps)
    return SeedCapacity(seed, round(capacity, 3), tried,
                        _bracketed([(p.qps, p.holds) for p in tried], capacity),
                        round(fair, 3), _bracketed([(p.qps, p.fair_holds) for p in tried], fair))


def _fair_capacity(point: Callable[[float], Point], points: dict[float, Point],
                   capacity: float, tolerance: float, steps: SearchSteps) -> float:
    """The fair edge, never above the capacity: a fair point holds the target too, and a
    rate above it that happens to hold (goodput is noisy near the edge) would report more
    fair capacity than capacity. Where the capacity search's own points already bracket it
    (one under the capacity held the fair rule, one above that did not), it is bisected
    from there; else searched from the capacity down in the wide steps of a search from
    the ceiling: the fair edge may lie far under the capacity (bursty traffic), and a
    narrow step would spend the search's runs before reaching it."""
    def fair(q: float) -> bool:
        return q <= capacity and point(q).fair_holds

    if fair(capacity):
        return capacity
    held = [q for q, p in points.items() if q <= capacity and p.fair_holds]
    if not held:
        return find_capacity(fair, start_qps=capacity, tolerance=tolerance,
                             growth=steps.fair_growth, max_runs=steps.fair_max_runs)
    lo = max(held)
    hi = min(q for q, p in points.items() if q > lo and not (q <= capacity and p.fair_holds))
    return bisect_edge(fair, lo, hi, tolerance=tolerance, max_runs=steps.fair_max_runs)


def _bracketed(verdicts: list[tuple[float, bool]], capacity: float) -> bool:
    """A rate held and a higher one failed (each point's (qps, held)): the search found
    the edge."""
    return capacity > 0 and any(not held and qps > capacity for qps, held in verdicts)
