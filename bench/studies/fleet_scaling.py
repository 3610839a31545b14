"""The fleet scaling table: goodput of 1, 4 and 16 boxes behind a gateway, by load.

For each box kind -- Ascendra (the capacity table's 2L1H at its defaults) and the
baseline (3xsarathi at its tuned chunk) -- each gateway picker, each fleet size and each
load, several seeds of `run_fleet` (bench/sim/fleet_run.py). A load is the rate *per box* as
a fraction of that kind's own single-box capacity on the ruler (read from the capacity
table, `docs/figures/capacity.json`), so 1.0 is the rate one box holds at 90 % goodput
and a fleet that routes perfectly should hold it at any size. Every fleet point runs
`requests_per_box` requests per box (the same simulated time at every size); the first
and last 10 % are not measured (bench/ruler/steady_state.py). With one box the picker has no
choice, so that point is run once per seed and reported under the picker `none`.

`ascendra reproduce fleet [--quick] [--num-requests N] --out DIR` prints the
configuration, runs the table and writes it as a `FleetScaling` document (DIR/fleet.json,
with DIR/fleet.png); `--num-requests` is the requests per box.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import mean

import msgspec

from bench.loadgen.workloads import workload
from bench.parallel import imap
from bench.ruler.ruler import RulerConfig, Subject
from bench.sim.fleet import GatewayConfig
from bench.sim.fleet_run import FleetResult, run_fleet
from engines.scheduler_config import SchedulerConfig
from bench.sim.endpoint_picker import Picker

CAPACITY_FILE = Path(__file__).resolve().parents[2] / "docs" / "figures" / "capacity.json"
#: The box kinds compared: (label, layout, the capacity table's row for its capacity).
KINDS = (("Ascendra", "2L1H", "2L1H"), ("baseline", "3xsarathi", "3xsarathi (tuned)"))
NO_PICKER = "none"


class BoxKind(msgspec.Struct, frozen=True, kw_only=True):
    label: str
    subject: Subject
    capacity_qps: float         # one box, on the ruler (capacity table, mean over seeds)


class ScalingConfig(msgspec.Struct, frozen=True, kw_only=True):
    kinds: tuple[BoxKind, ...]
    ruler: RulerConfig          # workload, profile, SLOs, controller, steady-state rule
    boxes: tuple[int, ...] = (1, 4, 16)
    loads: tuple[float, ...] = (0.6, 0.8, 1.0, 1.2)
    pickers: tuple[Picker, ...] = (Picker.EPP, Picker.LEAST_QUEUE, Picker.ROUND_ROBIN)
    seeds: tuple[int, ...] = (0, 1, 2)
    requests_per_box: int = 200
    refresh_interval: float = GatewayConfig().refresh_interval


class SeedPoint(msgspec.Struct, frozen=True, kw_only=True):
    seed: int
    goodput_pct: float
    goodput_rps: float
    holds: bool
    min_box_goodput_pct: float
    max_share_ratio: float
    #: What the gateway saw of a box, mean over boxes and scrapes (waiting, running, KV use).
    seen_waiting: float
    seen_running: float
    seen_kv_usage: float
    wall_s: float


class ScalingRow(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    layout: str
    picker: str                 # a Picker, or "none" for one box
    boxes: int
    load: float                 # per-box rate / one box's capacity
    qps: float                  # at the gateway, all boxes
    mean_goodput_pct: float
    min_goodput_pct: float
    max_goodput_pct: float
    mean_goodput_rps: float
    goodput_rps_per_box: float
    seeds: list[SeedPoint]


class FleetScaling(msgspec.Struct, frozen=True, kw_only=True):
    figure: str
    config: ScalingConfig
    rows: list[ScalingRow]
    wall_s: float


def capacities(path: Path = CAPACITY_FILE, workload_name: str = "poisson") -> dict[str, dict]:
    """The capacity table's rows of one workload, by label."""
    tables = json.loads(path.read_text())["tables"]
    table = next((t for t in tables if t["workload"] == workload_name), None)
    if table is None:
        raise ValueError(f"{path} has no {workload_name} table: run `ascendra reproduce capacity`")
    return {row["label"]: row for row in table["rows"]}


def default_config(quick: bool = False, requests_per_box: int | None = None,
                   capacity_file: Path = CAPACITY_FILE) -> ScalingConfig:
    rows = capacities(capacity_file)
    kinds = tuple(BoxKind(label=label, capacity_qps=rows[row]["mean_qps"],
                          subject=Subject(label=layout, layout=layout, scheduler=SchedulerConfig(
                              chunk_size=rows[row]["chunk_size"])))
                  for label, layout, row in KINDS)
    config = ScalingConfig(kinds=kinds, ruler=RulerConfig(workload=workload("poisson")))
    if quick:
        config = msgspec.structs.replace(config, boxes=(1, 4), loads=(0.8, 1.2), seeds=(0,),
                                         requests_per_box=100)
    if requests_per_box:
        config = msgspec.structs.replace(config, requests_per_box=requests_per_box)
    # the ruler's own seeds and measured count, restated: this table's, per box
    ruler = msgspec.structs.replace(config.ruler, seeds=config.seeds, measured=round(
        config.requests_per_box * (1 - config.ruler.rule.warmup - config.ruler.rule.cooldown)))
    return msgspec.structs.replace(config, ruler=ruler)


class _Job(msgspec.Struct, frozen=True):
    kind: BoxKind
    picker: str
    boxes: int
    load: float
    seed: int


def _jobs(config: ScalingConfig) -> list[_Job]:
    jobs = [_Job(kind, NO_PICKER if boxes == 1 else picker.value, boxes, load, seed)
            for kind in config.kinds for boxes in config.boxes for load in config.loads
            for picker in (config.pickers[:1] if boxes == 1 else config.pickers)
            for seed in config.seeds]
    return sorted(jobs, key=lambda j: -j.boxes)   # the longest first: the pool ends together


def _run_job(args: tuple[ScalingConfig, _Job]) -> FleetResult:
    config, job = args
    picker = Picker.EPP if job.picker == NO_PICKER else Picker(job.picker)
    gateway = GatewayConfig(picker=picker, refresh_interval=config.refresh_interval)
    return run_fleet([job.kind.subject] * job.boxes, config.ruler, gateway,
                     qps=job.load * job.kind.capacity_qps * job.boxes,
                     num_requests=config.requests_per_box * job.boxes, seed=job.seed)


def fleet_scaling(config: ScalingConfig, workers: int | None = None,
                  progress: Callable[[str], None] | None = None) -> list[ScalingRow]:
    jobs = _jobs(config)
    found: dict[_Job, FleetResult] = {}
    results = imap(_run_job, [(config, job) for job in jobs], workers)
    for n, (job, result) in enumerate(zip(jobs, results), start=1):
        found[job] = result
        if progress:
            progress(f"[{n}/{len(jobs)}] {job.kind.label:>9} {job.picker:>11} "
                     f"{job.boxes:>2} boxes load {job.load:.2f} seed {job.seed}: "
                     f"goodput {result.goodput_pct:5.1f}% ({result.wall_s:.0f} s)")
    groups: dict[tuple, list[tuple[_Job, FleetResult]]] = {}
    for job in jobs:
        groups.setdefault((job.kind.label, job.picker, job.boxes, job.load), []).append(
            (job, found[job]))
    return [_row(points) for _, points in sorted(groups.items(), key=lambda kv: _order(
        kv[0], config))]


def _order(key: tuple, config: ScalingConfig) -> tuple:
    label, picker, boxes, load = key
    pickers = [NO_PICKER, *(p.value for p in config.pickers)]
    return ([k.label for k in config.kinds].index(label), boxes, pickers.index(picker), load)


def _row(points: Sequence[tuple[_Job, FleetResult]]) -> ScalingRow:
    job = points[0][0]
    seeds = [SeedPoint(seed=j.seed, goodput_pct=r.goodput_pct, goodput_rps=r.goodput_rps,
                       holds=r.holds, min_box_goodput_pct=r.min_box_goodput_pct,
                       max_share_ratio=r.max_share_ratio,
                       seen_waiting=round(mean(b.seen_waiting for b in r.boxes), 2),
                       seen_running=round(mean(b.seen_running for b in r.boxes), 2),
                       seen_kv_usage=round(mean(b.seen_kv_usage for b in r.boxes), 4),
                       wall_s=r.wall_s)
             for j, r in sorted(points, key=lambda p: p[0].seed)]
    goodputs = [s.goodput_pct for s in seeds]
    rps = mean(s.goodput_rps for s in seeds)
    return ScalingRow(kind=job.kind.label, layout=job.kind.subject.layout, picker=job.picker,
                      boxes=job.boxes, load=job.load,
                      qps=round(job.load * job.kind.capacity_qps * job.boxes, 3),
                      mean_goodput_pct=round(mean(goodputs), 2), min_goodput_pct=min(goodputs),
                      max_goodput_pct=max(goodputs), mean_goodput_rps=round(rps, 3),
                      goodput_rps_per_box=round(rps / job.boxes, 3), seeds=seeds)


def fleet_document(config: ScalingConfig, workers: int | None = None,
                   progress: Callable[[str], None] | None = None) -> FleetScaling:
    """The whole table, its configuration printed first (through `progress`)."""
    if progress:
        progress("fleet scaling of " + msgspec.json.encode(config).decode())
    started = time.perf_counter()
    rows = fleet_scaling(config, workers, progress)
    doc = FleetScaling(figure="fleet", config=config, rows=rows,
                       wall_s=round(time.perf_counter() - started, 1))
    if progress:
        progress(markdown_table(doc))
    return doc


def markdown_table(doc: FleetScaling) -> str:
    """Goodput % (mean [min-max] over seeds) by box kind, picker and fleet size x load."""
    loads = doc.config.loads
    lines = ["| boxes | picker | " + " | ".join(f"load {x:g}" for x in loads) + " |",
             "|---|---|" + "---|" * len(loads)]
    for kind in doc.config.kinds:
        lines.append(f"| **{kind.label}** ({kind.subject.layout}, one box holds "
                     f"{kind.capacity_qps:g} QPS) |" + " |" * (len(loads) + 1))
        cells: dict[tuple, dict[float, ScalingRow]] = {}
        for row in doc.rows:
            if row.kind == kind.label:
                cells.setdefault((row.boxes, row.picker), {})[row.load] = row
        for (boxes, picker), by_load in cells.items():
            lines.append(f"| {boxes} | {picker} | " + " | ".join(
                _cell(by_load[x]) if x in by_load else "" for x in loads) + " |")
    return "\n".join(lines)


def _cell(row: ScalingRow) -> str:
    spread = (f" [{row.min_goodput_pct:.1f}–{row.max_goodput_pct:.1f}]"
              if len(row.seeds) > 1 else "")
    return f"{row.mean_goodput_pct:.1f} %{spread}, {row.goodput_rps_per_box:.2f}/box"
