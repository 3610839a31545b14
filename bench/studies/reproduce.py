"""The paper's evaluation figures (§8, figures 9–13), from the simulator.

Each `figN(...)` runs its simulations (in parallel over the machine's cores), writes
`<out>/figN.json` (every point: the settings and the summary numbers) and
`<out>/figN.png` (bench/studies/figures.py draws it), and returns the JSON document.
`threshold(...)` is the offload-threshold sweep (issue #5) in the same shape.

Settings follow the paper's Table 2 on the `a100-llama3-8b` profile: ShareGPT with a
1 s TTFT SLO, arxiv summarisation (this repo's long-prompt trace, standing in for
LongBench) with 2.5 s, TBT 0.15 s (mean per request, as the paper's goodput), three
instances: Ascendra `2L1H` against `3xsarathi` and `3xvllm-v0`. Every layout uses the
same token budget (`chunk_size`, default `DEFAULT_CHUNK`).

Defaults are sized so that each figure takes a few minutes on a 2-core machine;
`num_requests` scales every run up (more requests: closer to steady state), `quick`
scales down to a smoke test.
"""
from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from bench.parallel import imap
from bench.records.schema import RunResult
from bench.sim.box_run import simulate
from bench.sim.simulator import SimConfig
from daemon.core.controller_config import SloConfig
from daemon.layout import layout_modes
from engines.scheduler_config import SchedulerConfig
from policies.value import DEFAULT_VALUE_FUNCTION

PROFILE = "a100-llama3-8b"
TRACES = {"sharegpt": 1.0, "arxiv": 2.5}       # trace -> TTFT SLO (Table 2)
TBT_SLO = SloConfig().tbt_slo                  # the daemon's default, the paper's 0.15 s
BASELINES = ("3xsarathi", "3xvllm-v0")
LAYOUTS = ("2L1H", *BASELINES)
#: fig 9's lines: (layout, value function, label); Ascendra with its default value
#: function and with SJF (the baselines run FCFS whatever it says).
SERIES = (("2L1H", DEFAULT_VALUE_FUNCTION, "2L1H"), ("2L1H", "sjf", "2L1H-sjf"),
          *((b, DEFAULT_VALUE_FUNCTION, b) for b in BASELINES))
#: The token budget every layout gets: Sarathi-Serve sizes it so that one full step fits
#: the TBT SLO (about 2048 tokens here), and LP's compute budget cuts its steps to the SLO.
DEFAULT_CHUNK = 2048
FIXED_HP_BATCH = 128  # elastic batch off (fig 11): the paper's fixed batch
FIGURES = ("fig9", "fig10", "fig11", "fig12", "fig13", "threshold", "capacity", "ablation",
           "values", "fleet")


@dataclasses.dataclass(frozen=True)
class Point:
    """One simulation: a layout on a trace at a rate, and the knobs that differ."""
    layout: str
    trace: str
    qps: float
    num_requests: int
    ttft_slo: float
    tbt_slo: float = TBT_SLO
    seed: int = 0
    chunk_size: int = DEFAULT_CHUNK
    value_function: str = DEFAULT_VALUE_FUNCTION
    offload_threshold: float | None = None
    drop_expired: bool = False
    elastic_batch: bool = True      # HP's elastic batch (off: a fixed 128-request batch)
    label: str = ""                 # the series this point belongs to in the plot


def simulate_point(point: Point) -> RunResult:
    """Simulate one point."""
    from engines import modes

    saved = dict(modes.MODES)
    if not point.elastic_batch:
        modes.MODES["hp"] = dataclasses.replace(modes.HP, elastic_batch=False,
                                                default_max_num_seqs=FIXED_HP_BATCH)
    try:
        extra = {} if point.offload_threshold is None else {
            "offload_threshold": point.offload_threshold}
        scheduler = SchedulerConfig(chunk_size=point.chunk_size,
                                    value_function=point.value_function,
                                    drop_expired=point.drop_expired, **extra)
        sim = SimConfig(layout_modes=tuple(layout_modes(point.layout)), profile=PROFILE,
                        scheduler=scheduler,
                        slo=SloConfig(ttft_slo=point.ttft_slo, tbt_slo=point.tbt_slo))
        return simulate(sim, trace=point.trace, qps=point.qps,
                        num_requests=point.num_requests, seed=point.seed)
    finally:
        modes.MODES.clear()
        modes.MODES.update(saved)


def run_point(point: Point) -> dict:
    """Simulate one point; the summary numbers and per-instance rows, JSON-ready."""
    result = simulate_point(point)
    row = dataclasses.asdict(point)
    row.update({
        "goodput_pct": round(result.goodput_pct, 2),
        "goodput_rps": round(result.goodput_rps, 3),
        "throughput_rps": round(result.throughput_rps, 3),
        "duration_s": round(result.duration_s, 2),
        "good": result.good, "completed": result.completed, "dropped": result.dropped,
        "offloaded": result.offloaded,
        "slo_missed": result.completed - result.good,
        "p99_ttft_s": _r(result.ttft_s.p99), "mean_ttft_s": _r(result.ttft_s.mean),
        "mean_tbt_s": _r(result.mean_tbt_s.mean), "p99_tbt_s": _r(result.p99_tbt_s),
        "sched_delay_s": _r(result.sched_delay_s.mean),
        "wall_s": result.config.get("wall_s"),
        "per_instance": [{k: _r(v) if isinstance(v, float) else v for k, v in row.items()}
                         for row in result.per_instance],
    })
    return row


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def run_points(points: Sequence[Point], workers: int | None = None,
               progress: Callable[[str], None] | None = None) -> list[dict]:
    """Every point, in order; in parallel over `workers` processes (bench/parallel.py)."""
    rows = []
    for row in imap(run_point, points, workers):
        rows.append(row)
        _say(progress, row, len(rows), len(points))
    return rows


def _say(progress, row: dict, done: int, total: int) -> None:
    if progress:
        progress(f"[{done}/{total}] {row['label'] or row['layout']:>18} {row['trace']:>8} "
                 f"qps {row['qps']:6.2f}: goodput {row['goodput_pct']:5.1f}%  "
                 f"({row['wall_s']} s)")


# ---- the figures -------------------------------------------------------------------------
def _requests(num_requests: int | None, quick: bool, default: int) -> int:
    if num_requests:
        return num_requests
    return max(100, default // 4) if quick else default


def fig9(n: int | None = None, quick: bool = False, **kw) -> dict:
    """Goodput vs QPS (top row) and vs SLO scale at a fixed QPS (bottom row)."""
    n = _requests(n, quick, 600)
    qps = {"sharegpt": [6, 7, 8, 9, 10, 11, 12], "arxiv": [7, 8, 9, 10, 11, 12, 13]}
    scales = [0.5, 0.75, 1.0, 1.5, 2.0]
    fixed_qps = {"sharegpt": 9.0, "arxiv": 10.5}  # where 2L1H holds about 90%
    if quick:
        qps = {t: v[::2] for t, v in qps.items()}
        scales = [0.5, 1.0, 2.0]
    points = [Point(layout, trace, q, n, ttft, value_function=value, label=label)
              for trace, ttft in TRACES.items() for layout, value, label in SERIES
              for q in qps[trace]]
    points += [Point(layout, trace, fixed_qps[trace], n, ttft * s, TBT_SLO * s,
                     value_function=value, label=f"{label}@slo{s}")
               for trace, ttft in TRACES.items() for layout, value, label in SERIES
               for s in scales]
    rows = run_points(points, **kw)
    return {"figure": "fig9", "num_requests": n, "fixed_qps": fixed_qps, "slo_scales": scales,
            "rows": rows}


def fig10(n: int | None = None, quick: bool = False, qps: float = 9.0, **kw) -> dict:
    """Per instance at one load (ShareGPT): P99 TTFT, mean TBT, throughput, scheduling delay."""
    n = _requests(n, quick, 1500)
    rows = run_points([Point(layout, "sharegpt", qps, n, TRACES["sharegpt"], label=layout)
                       for layout in LAYOUTS], **kw)
    return {"figure": "fig10", "num_requests": n, "qps": qps, "rows": rows}


def fig11(n: int | None = None, quick: bool = False, **kw) -> dict:
    """Left: value functions (EDF, SJF, FCFS) on 2L1H. Right: HP elastic batch on vs off."""
    n = _requests(n, quick, 600)
    qps = [7, 8, 9, 10, 11] if not quick else [8, 10]
    ttft = TRACES["sharegpt"]
    points = [Point("2L1H", "sharegpt", q, n, ttft, value_function=v, label=f"2L1H-{v}")
              for v in ("edf", "sjf", "fcfs") for q in qps]
    points += [Point("2L1H", "sharegpt", q, n, ttft, elastic_batch=e,
                     label=f"elastic-{'on' if e else 'off'}")
               for e in (True, False) for q in qps]
    rows = run_points(points, **kw)
    return {"figure": "fig11", "num_requests": n, "rows": rows}


def fig12(n: int | None = None, quick: bool = False, qps: float = 10.0,
          minutes: float = 10.0, **kw) -> dict:
    """Overload just above capacity for `minutes` simulated minutes, drops on everywhere."""
    if quick:
        minutes = min(minutes, 1.0)
    n = n or int(round(qps * minutes * 60))
    ttft = TRACES["sharegpt"]
    rows = run_points([Point(layout, "sharegpt", qps, n, ttft, drop_expired=True, label=layout)
                       for layout in LAYOUTS], **kw)
    return {"figure": "fig12", "num_requests": n, "qps": qps, "minutes": minutes, "rows": rows}


def fig13(n: int | None = None, quick: bool = False, **kw) -> dict:
    """Left: two instances (1L1H vs 2xsarathi, 2xvllm-v0) on arxiv. Right: 2L1H vs 1L2H."""
    n = _requests(n, quick, 600)
    left_qps = [4, 5, 6, 7, 8] if not quick else [5, 7]
    right_qps = [7, 8, 9, 10, 11] if not quick else [8, 10]
    points = [Point(layout, "arxiv", q, n, TRACES["arxiv"], label=layout)
              for layout in ("1L1H", "2xsarathi", "2xvllm-v0") for q in left_qps]
    points += [Point(layout, "sharegpt", q, n, TRACES["sharegpt"], label=layout)
               for layout in ("2L1H", "1L2H") for q in right_qps]
    rows = run_points(points, **kw)
    return {"figure": "fig13", "num_requests": n, "rows": rows}


def threshold(n: int | None = None, quick: bool = False, **kw) -> dict:
    """Offload threshold sweep: 2L1H goodput on ShareGPT around its capacity, two seeds."""
    n = _requests(n, quick, 1000)
    thresholds = [0.5, 1.0, 1.5, 2.0, 3.0]
    qps = [9.0, 10.0] if not quick else [9.0]
    seeds = [0, 1] if not quick else [0]
    points = [Point("2L1H", "sharegpt", q, n, TRACES["sharegpt"], seed=s, offload_threshold=t,
                    label=f"threshold-{t}")
              for t in thresholds for q in qps for s in seeds]
    rows = run_points(points, **kw)
    return {"figure": "threshold", "num_requests": n, "thresholds": thresholds, "rows": rows}


#: The workloads of the capacity table (bench/loadgen/workloads.py).
CAPACITY_WORKLOADS = ("poisson", "bursty-cv2", "bursty-cv4", "onoff", "mixed-slo")


def capacity(n: int | None = None, quick: bool = False, workers: int | None = None,
             progress: Callable[[str], None] | None = None) -> dict:
    """docs/results.md's capacity table: every workload x layout on the ruler (steady state,
    seeds, tuned baselines, ceilings; bench/ruler/capacity_table.py). `n`: measured requests
    per point."""
    from bench.loadgen.workloads import workload
    from bench.ruler.capacity_table import capacity_table
    from bench.ruler.ruler import RulerConfig
    measured = n or (900 if quick else RulerConfig().measured)
    seeds = (0,) if quick else RulerConfig().seeds
    configs = [RulerConfig(workload=workload(name), measured=measured, seeds=seeds)
               for name in (CAPACITY_WORKLOADS[:2] if quick else CAPACITY_WORKLOADS)]
    tables = capacity_table(configs, workers=workers, progress=progress)
    return {"figure": "capacity", "measured": measured, "target_pct": configs[0].target,
            "tables": [msgspec.to_builtins(t) for t in tables]}


def ablation(n: int | None = None, quick: bool = False, workers: int | None = None,
             progress: Callable[[str], None] | None = None) -> dict:
    """What each part of the policy earns (bench/studies/ablation.py), one seed per point."""
    from bench.ruler.ruler import RulerConfig
    from bench.studies.ablation import ablation as run
    measured = n or (900 if quick else RulerConfig().measured)
    names = ("poisson",) if quick else ("poisson", "bursty-cv4", "mixed-slo")
    return {"figure": "ablation", "measured": measured,
            "rows": run(names, measured, workers=workers, progress=progress)}


def values(n: int | None = None, quick: bool = False, workers: int | None = None,
           progress: Callable[[str], None] | None = None) -> dict:
    """The LP value functions side by side on the ruler (bench/studies/ablation.py), one seed."""
    from bench.ruler.ruler import RulerConfig
    from bench.studies.ablation import VALUE_VARIANTS, ablation as run
    measured = n or (900 if quick else RulerConfig().measured)
    names = ("poisson",) if quick else ("poisson", "bursty-cv4", "mixed-slo")
    return {"figure": "values", "measured": measured,
            "rows": run(names, measured, workers=workers, progress=progress,
                        variants=VALUE_VARIANTS)}


def fleet(n: int | None = None, quick: bool = False, workers: int | None = None,
          progress: Callable[[str], None] | None = None) -> dict:
    """Goodput of 1, 4 and 16 boxes behind a gateway model, by load, picker and box kind
    (bench/studies/fleet_scaling.py). `n`: requests per box."""
    from bench.studies.fleet_scaling import default_config, fleet_document
    doc = fleet_document(default_config(quick, requests_per_box=n), workers, progress)
    return msgspec.to_builtins(doc)


def reproduce(figure: str, out: str | Path, *, num_requests: int | None = None,
              quick: bool = False, workers: int | None = None,
              progress: Callable[[str], None] | None = print) -> tuple[Path, Path]:
    """Run one figure, write `<out>/<figure>.json` and `.png`; the two paths."""
    from bench.studies import figures

    if figure not in FIGURES:
        raise ValueError(f"unknown figure {figure!r}; choose one of {', '.join(FIGURES)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    doc = globals()[figure](num_requests, quick, workers=workers, progress=progress)
    doc.update({"profile": PROFILE, "tbt_slo": TBT_SLO, "ttft_slo": TRACES,
                "quick": quick, "wall_s": round(time.perf_counter() - started, 1)})
    json_path = out / f"{figure}.json"
    json_path.write_text(json.dumps(doc, indent=1) + "\n")
    png_path = out / f"{figure}.png"
    figures.draw(doc, png_path)
    return json_path, png_path
