"""One simulated run: a workload through the simulator, summarised in the shared schema."""
from __future__ import annotations

import time

from bench.loadgen.workload import WorkloadRequest, build_workload
from bench.records.schema import RequestRecord, RunResult
from bench.records.results import percentiles, summarize
from bench.sim.simulator import SimConfig, Simulation
from engines.gc_freeze import few_collections
from ipc.messages import Role


def simulate(sim: SimConfig, requests: list[WorkloadRequest] | None = None, *,
             trace: str | None = None, qps: float | None = None, num_requests: int | None = None,
             seed: int = 0, burstiness: float = 1.0, config: dict | None = None,
             keep_records: bool = False) -> RunResult:
    """Simulate `requests` (e.g. from bench/loadgen/workloads.py `build_requests`), or
    `num_requests` requests of `trace` at `qps` (bench/loadgen/workload.py `build_workload`); with
    `keep_records` the result carries every request's record too."""
    if requests is None:
        if trace is None or qps is None or num_requests is None:
            raise ValueError("simulate: give requests, or trace, qps and num_requests")
        workload = build_workload(trace, rate=qps, burstiness=burstiness,
                                  num_requests=num_requests, seed=seed,
                                  max_model_len=sim.max_model_len)
        config = {"trace": trace, "qps": qps, "burstiness": burstiness, **(config or {})}
    elif trace is not None or qps is not None or num_requests is not None:
        raise ValueError("simulate: give requests or a trace to build them from, not both")
    else:
        workload = list(requests)
    started = time.perf_counter()
    simulation = Simulation(sim, workload)
    with few_collections():
        records = simulation.run()
    classes = {w.index: w.slo_class for w in workload if w.slo_class is not None}
    for record in records:
        record.slo_class = classes.get(record.index, record.slo_class)
    wall = time.perf_counter() - started
    ends = [r.end_time for r in records if r.end_time is not None]
    duration = (max(ends) - min(r.arrival for r in records)) if ends else 0.0
    lp_mapes = [i.core.perf_model.mape for i in simulation.instances
                if i.core.role is Role.LP and i.core.perf_model
                and i.core.perf_model.mape is not None]
    run_config = {"seed": seed,
                  "layout_modes": list(sim.layout_modes), "profile": sim.profile,
                  "slo": {"ttft_slo": sim.slo.ttft_slo, "tbt_slo": sim.slo.tbt_slo},
                  "scheduler": {k: getattr(sim.scheduler, k) for k in sim.scheduler.__struct_fields__},
                  "ipc_delay": sim.ipc_delay, "latency": sim.latency or f"profile:{sim.profile}",
                  "wall_s": round(wall, 3), **(config or {})}
    return summarize(records, run_config, duration, sim.slo.ttft_slo, sim.slo.tbt_slo,
                     per_instance=per_instance(simulation, records, sim),
                     perf_model_mape=sum(lp_mapes) / len(lp_mapes) if lp_mapes else None,
                     keep_records=keep_records)


def per_instance(simulation: Simulation, records: list[RequestRecord], sim: SimConfig) -> list[dict]:
    """Per instance: what it served and how (the paper's Figure 10 quantities)."""
    rows = []
    for inst in simulation.instances:
        mine = [r for r in records if r.instance == inst.instance_id and r.outcome == "completed"]
        perf = inst.core.perf_model
        rows.append({
            "id": inst.instance_id, "role": inst.core.role.value, "served": len(mine),
            "offloaded_in": sum(1 for r in mine if r.offloaded),
            "steps": inst.core.num_steps, "busy_s": round(inst.executor.busy_time, 3),
            "preemptions": inst.core.scheduler.num_preemptions,
            "p99_ttft_s": percentiles([r.ttft() for r in mine]).p99,
            "mean_tbt_s": percentiles([r.mean_tbt() for r in mine if r.mean_tbt() is not None]).mean,
            "sched_delay_s": percentiles([r.sched_delay for r in mine
                                          if r.sched_delay is not None]).mean,
            "output_tokens": sum(r.output_tokens() for r in mine),
            "perf_model_mape": perf.mape if perf else None,
        })
        if sim.dynamic_roles:  # `<n>A`: when it changed role, and its seconds in each
            rows[-1].update(role_times(simulation, inst.instance_id, duration_end(records)))
    return rows


def duration_end(records: list[RequestRecord]) -> float:
    return max((r.end_time for r in records if r.end_time is not None), default=0.0)


def role_times(simulation: Simulation, instance_id: int, end: float) -> dict:
    """An `<n>A` instance's role changes ("at s: lp -> hp (why)") and its seconds as LP
    and as HP up to `end` (it started as its layout says)."""
    mode = simulation.config.layout_modes[instance_id]
    role, since, seconds = mode, 0.0, {"lp": 0.0, "hp": 0.0}
    changes = []
    for switch in simulation.keeper.role_switches:
        if switch.instance_id != instance_id:
            continue
        seconds[role] = seconds.get(role, 0.0) + switch.time - since
        role, since = switch.new.value, switch.time
        changes.append(f"{switch.time:.1f} s: {switch.old.value} -> {switch.new.value} "
                       f"({switch.reason})")
    seconds[role] = seconds.get(role, 0.0) + max(end - since, 0.0)
    return {"role_changes": changes, "lp_s": round(seconds["lp"], 1),
            "hp_s": round(seconds["hp"], 1)}


__all__ = ["simulate", "per_instance"]
