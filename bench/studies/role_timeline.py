"""The role timeline: what `3A` does on traffic whose character shifts, beside the static
splits on the same requests (docs/design.md §5.10).

    python -m bench.studies.role_timeline [--qps 9] [--num-requests 3240] [--seed 0]
        [--layouts 3A,3L0H,2L1H,1L2H] [--window 10] [--json OUT] [--figure PNG]

Every layout runs the `shifting` workload (poisson, mixed-slo with a large interactive
share, bursty-cv4; 60 s each, repeated) at one rate on one seed, the same requests. Out:
each layout's goodput per window of arrivals and per phase, and the `<n>A` layouts' role
changes (when, which instance, why) with their HP count over time. The figure stacks the
goodput per window (one line per layout, the phases shaded) over the HP count of each
`<n>A` layout.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import msgspec

from bench.json_file import write_json
from bench.loadgen.shifting import DEFAULT_PHASE_SECONDS, PHASES, per_phase
from bench.loadgen.workloads import build_requests, workload
from bench.parallel import add_workers_flag, run_parallel
from bench.records.results import is_good
from bench.ruler.ruler import RulerConfig, Subject, sim_config
from bench.sim.simulator import Simulation
from daemon.layout import dynamic_roles, layout_modes


class RoleChange(msgspec.Struct, kw_only=True):
    time: float                     # simulated seconds
    instance: int
    old: str
    new: str
    reason: str


class LayoutTimeline(msgspec.Struct, kw_only=True):
    layout: str
    goodput_pct: float
    window_goodput_pct: list[float | None]     # by arrival window; None: no arrival in it
    #: "1: poisson" etc. -> goodput, every repetition of a phase together
    phase_goodput_pct: dict[str, float]
    role_changes: list[RoleChange] = []
    #: HPs at the start of each window (`<n>A` only).
    window_hps: list[int] = []


class RoleTimeline(msgspec.Struct, kw_only=True):
    qps: float
    seed: int
    num_requests: int
    window_s: float
    phase_seconds: tuple[float, ...]
    ttft_slo: float
    tbt_slo: float
    layouts: list[LayoutTimeline]


def _run(job: tuple[str, RulerConfig, float, int, int, float]) -> LayoutTimeline:
    layout, config, qps, seed, n, window = job
    requests = build_requests(config.workload, rate=qps, num_requests=n, seed=seed,
                              max_model_len=config.max_model_len)
    simulation = Simulation(sim_config(Subject(label=layout, layout=layout), config), requests)
    records = simulation.run()
    ttft, tbt = config.slo.ttft_slo, config.slo.tbt_slo
    good = [is_good(r, ttft, tbt) for r in records]
    span = max(r.arrival for r in records)
    windows = int(span // window) + 1
    per_window: list[list[bool]] = [[] for _ in range(windows)]
    for record, ok in zip(records, good):
        per_window[int(record.arrival // window)].append(ok)
    changes = [RoleChange(time=round(s.time, 2), instance=s.instance_id, old=s.old.value,
                          new=s.new.value, reason=s.reason)
               for s in simulation.keeper.role_switches]
    return LayoutTimeline(
        layout=layout, goodput_pct=_pct(good),
        window_goodput_pct=[_pct(w) if w else None for w in per_window],
        phase_goodput_pct={p.phase: p.goodput_pct for p in per_phase(
            records, DEFAULT_PHASE_SECONDS, ttft, tbt)},
        role_changes=changes,
        window_hps=(_hps_by_window(layout, changes, windows, window)
                    if dynamic_roles(layout) else []))


def _pct(oks: list[bool]) -> float:
    return round(100.0 * sum(oks) / len(oks), 2)


def _hps_by_window(layout: str, changes: list[RoleChange], windows: int,
                   window: float) -> list[int]:
    """The number of HP instances at the start of each window."""
    roles = list(layout_modes(layout))
    hps, pending = [], sorted(changes, key=lambda c: c.time)
    for k in range(windows):
        while pending and pending[0].time <= k * window:
            change = pending.pop(0)
            roles[change.instance] = change.new
        hps.append(sum(role == "hp" for role in roles))
    return hps


def role_timeline(layouts: list[str], qps: float, seed: int, n: int, window: float,
                  workers: int | None = None) -> RoleTimeline:
    config = RulerConfig(workload=workload("shifting"))
    jobs = [(layout, config, qps, seed, n, window) for layout in layouts]
    return RoleTimeline(qps=qps, seed=seed, num_requests=n, window_s=window,
                        phase_seconds=DEFAULT_PHASE_SECONDS, ttft_slo=config.slo.ttft_slo,
                        tbt_slo=config.slo.tbt_slo,
                        layouts=run_parallel(_run, jobs, workers))


def print_timeline(doc: RoleTimeline) -> None:
    print(f"shifting at {doc.qps:g} QPS, seed {doc.seed}, {doc.num_requests} requests; "
          f"goodput % (all, then by phase)")
    for row in doc.layouts:
        phases = ", ".join(f"{name} {pct:.1f}" for name, pct in row.phase_goodput_pct.items())
        print(f"  {row.layout:>6}: {row.goodput_pct:5.1f}  ({phases})")
        for c in row.role_changes:
            print(f"          {c.time:7.1f} s: instance {c.instance} {c.old} -> {c.new} "
                  f"({c.reason})")


def figure(doc: RoleTimeline, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dynamic = [row for row in doc.layouts if row.window_hps]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    starts = [k * doc.window_s for k in range(len(doc.layouts[0].window_goodput_pct))]
    for row in doc.layouts:
        top.plot(starts, row.window_goodput_pct, marker=".",
                 linewidth=2.2 if row.window_hps else 1.2,
                 label=f"{row.layout} ({row.goodput_pct:.1f} %)")
    for row in dynamic:
        bottom.step(starts, row.window_hps, where="post", label=row.layout)
    end = starts[-1] + doc.window_s
    shades = ("white", "tab:orange", "tab:gray")      # one per phase, in PHASES' order
    for ax in (top, bottom):
        t = 0.0
        while t < end:
            for length, shade in zip(doc.phase_seconds, shades):
                ax.axvspan(t, t + length, color=shade, alpha=0.12, linewidth=0)
                t += length
    floor = max(0, 10 * int(min(g for row in doc.layouts for g in row.window_goodput_pct
                                if g is not None) // 10) - 10)
    for k, name in enumerate(PHASES):
        top.text(sum(doc.phase_seconds[:k]) + 2, floor + 1, name, fontsize=8)
    top.set_ylabel(f"goodput per {doc.window_s:g} s of arrivals (%)")
    top.set_ylim(floor, 101)
    top.set_xlim(0, end)
    top.legend(loc="lower right", fontsize=8)
    top.set_title(f"shifting workload at {doc.qps:g} QPS, seed {doc.seed}: the same requests "
                  "on each layout")
    bottom.set_ylabel("HP instances")
    bottom.set_xlabel("arrival time (simulated s)")
    instances = max((len(layout_modes(row.layout)) for row in dynamic), default=0)
    bottom.set_yticks(range(0, instances))      # never all HPs: one LP at least
    bottom.legend(loc="upper right", fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.role_timeline",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qps", type=float, default=9.0)
    parser.add_argument("--num-requests", type=int, default=3240,
                        help="default: two 180 s cycles at 9 QPS")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layouts", default="3A,3L0H,2L1H,1L2H")
    parser.add_argument("--window", type=float, default=10.0, help="seconds of arrivals")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--figure", type=Path)
    add_workers_flag(parser)
    args = parser.parse_args(argv)
    doc = role_timeline(args.layouts.split(","), args.qps, args.seed, args.num_requests,
                        args.window, args.workers)
    print_timeline(doc)
    if args.json:
        write_json(args.json, doc)
        print(f"written to {args.json}")
    if args.figure:
        figure(doc, args.figure)
        print(f"figure written to {args.figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
