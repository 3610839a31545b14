"""`python -m bench.studies.tenants --out FILE`: tenants sharing one box (issue #29) -- does
a flood from one tenant take the others' service, do weights set the shares, is
sheddable traffic shed first, and does anyone starve?

Every run is poisson ShareGPT on `a100-llama3-8b`, three instances, the daemon's SLOs
(TTFT 1 s, mean TBT 0.15 s), its load a multiple of the box's capacity C (`--capacity`,
default DEFAULT_CAPACITY: 2L1H's capacity on this workload, docs/results.md). Each
arrival draws its tenant from a `--tenant-mix`-like mix (bench/loadgen/tenant_mix.py):
arrivals and lengths are the same with and without the mix, so a run with tenants and
the same requests sent as one tenant differ only in who the server is told sent them.
Goodput is over the measured middle of a run (the ruler's warm-up and cool-down left out:
bench/ruler/steady_state.py). Phases (`--phases`, default all):

* `flood`: tenant `heavy` at 3 x C and `light` at 0.2 x C, equal weights, on 2L1H with
  fair shares on, 2L1H with `--no-fair-share` (the rule before fair shares: the costliest
  late request is shed first, whoever sent it), and the tuned baselines 3xvllm-v1 (budget 8192) and
  3xsarathi (chunk 2048), both with drops. Per tenant goodput, and total goodput beside
  the same requests sent as one tenant (at the same offered load, 3.2 x C).
* `weights`: two backlogged tenants `a` and `b`, each at 1.5 x C, weights 2:1 then 1:1,
  on 2L1H: service (prompt tokens at a request's first token, output tokens at their
  token times) per tenant in every `--window`-second window of the steady state, the
  ratio a/b per window, and its worst deviation from the weights' ratio. A figure of the
  per-window shares goes to `--figures` (weights.png).
* `sheddable`: 2 x C, half of the arrivals from tenant `batch` at priority -1 (sheddable),
  half from `chat` at 0, on 2L1H: the non-sheddable tenant's goodput, beside the same
  requests with no priorities and `chat` alone (what it gets with no batch traffic);
  and at 0.8 x C, where the box is not saturated, both tenants beside no priorities
  (sheddable traffic must not be shed for being sheddable).
* `starvation`: over every run above (with none of them asked for: the flood's 2L1H
  runs), the longest any request waited for an answer (its first token, or its drop) in
  multiples of max_wait_slo_multiple x its TTFT target: must be <= 1 on Ascendra's
  layouts (a baseline binds at arrival and has no such bound; shown for reference).

The full default (3 seeds) runs in a few minutes on 2 cores; `--quick` (one seed, short
runs, 10 s windows) in under one. The tenant policy lives in the controller core
(policies/tenants.py); the runs pass each request's tenant and priority to it
(bench/sim/simulator.py) and the mix's weights as `[tenants] tenant_weights`.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from bench.json_file import write_json
from bench.loadgen.tenant_mix import TenantShare, mix_text
from bench.loadgen.workload import WorkloadRequest
from bench.loadgen.workloads import build_requests, workload
from bench.parallel import add_workers_flag, run_parallel
from bench.records.schema import RequestRecord, TenantResult
from bench.records.results import is_good, per_tenant, token_goodput_pct
from bench.ruler.ruler import RulerConfig, Subject, sim_config
from bench.ruler.steady_state import MeasureRule
from bench.sim.sim_flags import on_profile, profile_argument
from bench.sim.simulator import Simulation
from daemon.core.controller_config import TenantsConfig
from engines.scheduler_config import SchedulerConfig
from policies.tenants import DEFAULT_TENANT

#: 2L1H's capacity on poisson ShareGPT, a100-llama3-8b, three instances, QPS at 90 %
#: goodput: docs/results.md (seed 0, 4,500 measured, after the ticket-pick change: 11.34;
#: the baselines section's two seeds at 2,250 measured: 11.37).
DEFAULT_CAPACITY = 11.3
PHASES = ("flood", "weights", "sheddable", "starvation")
RULE = MeasureRule()
#: Layouts with the controller's waiting room, whose max_wait_slo_multiple bounds a wait.
ASCENDRA_PREFIX = "2L1H"


class Setup(msgspec.Struct, frozen=True, kw_only=True):
    """One row of a phase: a layout at its settings, with or without fair shares."""
    label: str
    layout: str
    scheduler: SchedulerConfig = SchedulerConfig()
    fair_share: bool = True


FLOOD_SETUPS = (
    Setup(label="2L1H", layout="2L1H"),
    Setup(label="2L1H --no-fair-share (costliest late first)", layout="2L1H", fair_share=False),
    Setup(label="3xvllm-v1@8192+drops", layout="3xvllm-v1",
          scheduler=SchedulerConfig(chunk_size=8192, drop_expired=True)),
    Setup(label="3xsarathi@2048+drops", layout="3xsarathi",
          scheduler=SchedulerConfig(chunk_size=2048, drop_expired=True)),
)
ASCENDRA = Setup(label="2L1H", layout="2L1H")


class Job(msgspec.Struct, frozen=True, kw_only=True):
    phase: str
    variant: str                        # what this run of the row is (e.g. "tenants")
    setup: Setup
    mix: tuple[TenantShare, ...]
    qps: float
    seed: int
    num_requests: int | None = None
    duration: float | None = None       # seconds of arrivals, instead of num_requests
    #: How the requests are sent: "tenants" (as the mix draws them), "one tenant" (the
    #: same requests, no tenant nor priority), "no priorities" (tenants, priority 0), or
    #: "only:<tenant>" (that tenant's requests alone).
    send: str = "tenants"
    window: float = 60.0
    #: the profile (`--profile`, at its own SLOs) and context limit of every run
    profile: str = RulerConfig().profile
    max_model_len: int = RulerConfig().max_model_len


class Run(msgspec.Struct, kw_only=True):
    """One simulated run, measured: per tenant (by the mix's draw, whatever was sent)."""
    phase: str
    label: str
    variant: str
    seed: int
    qps: float                          # offered, all tenants
    num_requests: int
    goodput_pct: float                  # measured middle
    token_goodput_pct: float
    tenants: list[TenantResult]         # measured middle
    #: The longest wait for an answer, in TTFT targets, and over max_wait_slo_multiple of
    #: them (starvation: must be <= 1 where the controller bounds waits).
    max_wait_slo_multiple: float | None
    max_wait_ratio: float | None
    #: Service (prompt + output tokens computed) per tenant in each window from 0 s, and
    #: the windows of the steady state (inside the measured arrivals) [first, last).
    window_s: float = 60.0
    service: dict[str, list[int]] = {}
    steady_windows: tuple[int, int] = (0, 0)
    wall_s: float = 0.0


def _config(job: Job, mix: Sequence[TenantShare] | None) -> RulerConfig:
    return on_profile(RulerConfig(
        workload=workload("poisson", tenant_mix=tuple(mix) if mix else None),
        tenants=TenantsConfig(fair_share=job.setup.fair_share)), job.profile, job.max_model_len)


def _requests(job: Job) -> list[WorkloadRequest]:
    """The mix's requests, as `job.send` says they are sent."""
    requests = build_requests(_config(job, job.mix).workload, rate=job.qps,
                              num_requests=job.num_requests, duration=job.duration,
                              seed=job.seed, max_model_len=job.max_model_len)
    if job.send == "one tenant":
        return [msgspec.structs.replace(r, tenant=None, priority=0) for r in requests]
    if job.send == "no priorities":
        return [msgspec.structs.replace(r, priority=0) for r in requests]
    if job.send.startswith("only:"):
        return [r for r in requests if r.tenant == job.send.removeprefix("only:")]
    return requests


def run_job(job: Job) -> Run:
    started = time.perf_counter()
    requests = _requests(job)
    config = _config(job, job.mix if job.send != "one tenant" else None)
    subject = Subject(label=job.setup.label, layout=job.setup.layout,
                      scheduler=job.setup.scheduler)
    records = Simulation(sim_config(subject, config), requests).run()
    # what each request was by the mix's draw, whatever the server was told
    drawn = {r.index: (r.tenant, r.priority) for r in _requests(
        msgspec.structs.replace(job, send="tenants"))}
    for r in records:
        r.tenant, r.priority = drawn[r.index]
    slo = config.slo
    measured = RULE.measured(records)
    good = sum(is_good(r, slo.ttft_slo, slo.tbt_slo) for r in measured)
    waits = [w / (r.ttft_slo or slo.ttft_slo) for r in records
             if (w := r.answer_wait()) is not None]
    longest = max(waits, default=None)
    first, last = _steady_windows(records, measured, job.window)
    return Run(phase=job.phase, label=job.setup.label, variant=job.variant, seed=job.seed,
               qps=job.qps, num_requests=len(records),
               goodput_pct=round(100.0 * good / len(measured), 2) if measured else 0.0,
               token_goodput_pct=round(token_goodput_pct(measured, slo.ttft_slo,
                                                         slo.tbt_slo), 2),
               tenants=[_rounded(t) for t in per_tenant(measured, slo.ttft_slo, slo.tbt_slo)],
               max_wait_slo_multiple=None if longest is None else round(longest, 3),
               max_wait_ratio=None if longest is None else round(
                   longest / config.controller.max_wait_slo_multiple, 4),
               window_s=job.window, service=service_per_window(records, job.window),
               steady_windows=(first, last),
               wall_s=round(time.perf_counter() - started, 2))


def _rounded(t: TenantResult) -> TenantResult:
    return msgspec.structs.replace(
        t, goodput_pct=round(t.goodput_pct, 2), token_goodput_pct=round(t.token_goodput_pct, 2),
        p99_ttft_s=None if t.p99_ttft_s is None else round(t.p99_ttft_s, 4))


def service_per_window(records: Sequence[RequestRecord], window: float) -> dict[str, list[int]]:
    """Tokens the box computed for each tenant in each `window`-second window from time 0:
    a request's prompt at its first token, each output token at its time (a record with
    fewer token times than tokens -- a live client's chunks -- spreads them evenly)."""
    ends = [t for r in records for t in r.token_times]
    if not ends:
        return {}
    windows = int(max(ends) // window) + 1
    service: dict[str, list[float]] = {}
    for r in records:
        if r.first_token_time is None:
            continue
        mine = service.setdefault(r.tenant or DEFAULT_TENANT, [0.0] * windows)
        mine[int(r.first_token_time // window)] += r.prompt_len
        per_time = r.output_tokens() / len(r.token_times) if r.token_times else 0.0
        for t in r.token_times:
            mine[int(t // window)] += per_time
    return {name: [round(v) for v in values] for name, values in service.items()}


def _steady_windows(records: Sequence[RequestRecord], measured: Sequence[RequestRecord],
                    window: float) -> tuple[int, int]:
    """[first, last) of the windows wholly inside the measured arrivals (the steady
    state: past the warm-up, before the cool-down's drain)."""
    if not measured:
        return (0, 0)
    start, stop = measured[0].arrival, measured[-1].arrival
    first, last = math.ceil(start / window), math.floor(stop / window)
    return (first, max(first, last))


# ---- the phases ---------------------------------------------------------------------------
def flood_jobs(capacity: float, seeds: Sequence[int], n: int) -> list[Job]:
    mix = (TenantShare("heavy", 3.0 / 3.2), TenantShare("light", 0.2 / 3.2))
    return [Job(phase="flood", variant=variant, setup=setup, mix=mix, qps=3.2 * capacity,
                seed=seed, num_requests=n, send=variant)
            for setup in FLOOD_SETUPS for seed in seeds
            for variant in ("tenants", "one tenant")]


def weights_jobs(capacity: float, seeds: Sequence[int], seconds: float,
                 window: float) -> list[Job]:
    return [Job(phase="weights", variant=f"{wa:g}:{wb:g}", setup=ASCENDRA,
                mix=(TenantShare("a", 0.5, wa), TenantShare("b", 0.5, wb)), qps=3.0 * capacity,
                seed=seed, duration=seconds, window=window)
            for wa, wb in ((2.0, 1.0), (1.0, 1.0)) for seed in seeds]


#: The sheddable phase's loads (x C, all that is sent) and what is sent at each: at 2 x C
#: the box is saturated (sheddable traffic must go first); at 0.8 x C it is not (it must
#: not be shed for being sheddable).
SHEDDABLE_VARIANTS = ((2.0, (("batch sheddable", "tenants"), ("no priorities", "no priorities"),
                             ("chat alone", "only:chat"))),
                      (0.8, (("batch sheddable, 0.8 x C", "tenants"),
                             ("no priorities, 0.8 x C", "no priorities"))))


def sheddable_jobs(capacity: float, seeds: Sequence[int], n: int) -> list[Job]:
    mix = (TenantShare("chat", 0.5), TenantShare("batch", 0.5, 1.0, -1))
    return [Job(phase="sheddable", variant=variant, setup=ASCENDRA, mix=mix,
                qps=load * capacity, seed=seed, num_requests=n, send=send)
            for load, variants in SHEDDABLE_VARIANTS for seed in seeds
            for variant, send in variants]


def starvation_jobs(capacity: float, seeds: Sequence[int], n: int) -> list[Job]:
    return [j for j in flood_jobs(capacity, seeds, n)
            if j.setup.layout.startswith(ASCENDRA_PREFIX) and j.variant == "tenants"]


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(sum(present) / len(present), 2) if present else None


def _tenant(run: Run, name: str) -> TenantResult | None:
    return next((t for t in run.tenants if t.tenant == name), None)


class FloodRow(msgspec.Struct, kw_only=True):
    label: str
    qps: float
    heavy_goodput_pct: float            # means over seeds, measured middle
    light_goodput_pct: float
    light_served_tokens: float
    total_goodput_pct: float
    one_tenant_goodput_pct: float       # the same requests, sent as one tenant
    one_tenant_light_goodput_pct: float  # light's requests then


def flood_summary(runs: list[Run]) -> list[FloodRow]:
    rows = []
    for setup in FLOOD_SETUPS:
        mine = [r for r in runs if r.phase == "flood" and r.label == setup.label]
        split = [r for r in mine if r.variant == "tenants"]
        one = [r for r in mine if r.variant == "one tenant"]
        if not split:
            continue

        def tenant_mean(group: list[Run], name: str, field: str = "goodput_pct") -> float:
            return _mean([getattr(_tenant(r, name), field) for r in group
                          if _tenant(r, name)]) or 0.0

        rows.append(FloodRow(
            label=setup.label, qps=split[0].qps,
            heavy_goodput_pct=tenant_mean(split, "heavy"),
            light_goodput_pct=tenant_mean(split, "light"),
            light_served_tokens=tenant_mean(split, "light", "served_tokens"),
            total_goodput_pct=_mean([r.goodput_pct for r in split]) or 0.0,
            one_tenant_goodput_pct=_mean([r.goodput_pct for r in one]) or 0.0,
            one_tenant_light_goodput_pct=tenant_mean(one, "light")))
    return rows


class WeightsRow(msgspec.Struct, kw_only=True):
    weights: str                        # a:b
    seed: int
    target_ratio: float                 # weight a / weight b
    window_s: float
    windows: list[int]                  # the steady windows' indices
    service_a: list[int]                # tokens per steady window
    service_b: list[int]
    ratios: list[float | None]          # a / b per steady window
    mean_ratio: float | None            # of the steady windows' totals
    #: The furthest a window's ratio is from the target, relative to it (0.1 = 10 %).
    worst_deviation: float | None


def weights_summary(runs: list[Run]) -> list[WeightsRow]:
    rows = []
    for run in (r for r in runs if r.phase == "weights"):
        wa, wb = (float(w) for w in run.variant.split(":"))
        first, last = run.steady_windows
        idx = list(range(first, last))
        a = [run.service.get("a", [])[k] if k < len(run.service.get("a", [])) else 0
             for k in idx]
        b = [run.service.get("b", [])[k] if k < len(run.service.get("b", [])) else 0
             for k in idx]
        target = wa / wb
        ratios = [round(x / y, 3) if y else None for x, y in zip(a, b)]
        present = [q for q in ratios if q is not None]
        rows.append(WeightsRow(
            weights=run.variant, seed=run.seed, target_ratio=target, window_s=run.window_s,
            windows=idx, service_a=a, service_b=b, ratios=ratios,
            mean_ratio=round(sum(a) / sum(b), 3) if sum(b) else None,
            worst_deviation=round(max(abs(q / target - 1) for q in present), 3)
            if present else None))
    return rows


class SheddableRow(msgspec.Struct, kw_only=True):
    variant: str
    qps: float                          # offered, all that was sent
    chat_goodput_pct: float | None      # the non-sheddable tenant's, mean over seeds
    batch_goodput_pct: float | None
    goodput_pct: float | None           # every measured request sent


def sheddable_summary(runs: list[Run]) -> list[SheddableRow]:
    rows = []
    for variant in dict.fromkeys(r.variant for r in runs if r.phase == "sheddable"):
        mine = [r for r in runs if r.phase == "sheddable" and r.variant == variant]

        def tenant_mean(name: str) -> float | None:
            return _mean([_tenant(r, name).goodput_pct for r in mine if _tenant(r, name)])

        rows.append(SheddableRow(
            variant=variant, qps=mine[0].qps / (2 if variant == "chat alone" else 1),
            chat_goodput_pct=tenant_mean("chat"), batch_goodput_pct=tenant_mean("batch"),
            goodput_pct=_mean([r.goodput_pct for r in mine])))
    return rows


class StarvationRow(msgspec.Struct, kw_only=True):
    phase: str
    label: str
    variant: str
    max_wait_slo_multiple: float | None   # worst over seeds, in TTFT targets
    max_wait_ratio: float | None          # ... over max_wait_slo_multiple of them
    bounded: bool                          # the controller bounds its waits (Ascendra)
    ok: bool | None                        # ratio <= 1 (None where not bounded)


def starvation_summary(runs: list[Run]) -> list[StarvationRow]:
    rows = []
    keys = dict.fromkeys((r.phase, r.label, r.variant) for r in runs)
    for phase, label, variant in keys:
        mine = [r for r in runs if (r.phase, r.label, r.variant) == (phase, label, variant)]
        multiple = max((r.max_wait_slo_multiple for r in mine
                        if r.max_wait_slo_multiple is not None), default=None)
        ratio = max((r.max_wait_ratio for r in mine if r.max_wait_ratio is not None),
                    default=None)
        bounded = label.startswith(ASCENDRA_PREFIX)
        rows.append(StarvationRow(phase=phase, label=label, variant=variant,
                                  max_wait_slo_multiple=multiple, max_wait_ratio=ratio,
                                  bounded=bounded,
                                  ok=(ratio is not None and ratio <= 1.0 + 1e-6)
                                  if bounded else None))
    return rows


class TenantsStudy(msgspec.Struct, kw_only=True):
    config: dict
    flood: list[FloodRow] = []
    weights: list[WeightsRow] = []
    sheddable: list[SheddableRow] = []
    starvation: list[StarvationRow] = []
    runs: list[Run] = []
    wall_s: float = 0.0


# ---- printing -----------------------------------------------------------------------------
def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_flood(rows: list[FloodRow], capacity: float) -> None:
    if not rows:
        return
    print(f"\nflood: heavy at 3 x C and light at 0.2 x C (C = {capacity:g} QPS; "
          f"{rows[0].qps:.2f} QPS offered), equal weights; goodput %, measured middle, mean "
          "over seeds")
    print(f"  {'row':<40} {'heavy':>6} {'light':>6} {'total':>6} {'one tenant':>11} "
          f"{'light, one tenant':>18}")
    for r in rows:
        print(f"  {r.label:<40} {r.heavy_goodput_pct:6.1f} {r.light_goodput_pct:6.1f} "
              f"{r.total_goodput_pct:6.1f} {r.one_tenant_goodput_pct:11.1f} "
              f"{r.one_tenant_light_goodput_pct:18.1f}")


def print_weights(rows: list[WeightsRow]) -> None:
    if not rows:
        return
    print(f"\nweights: a and b at 1.5 x C each on 2L1H; service a / b per {rows[0].window_s:g} s "
          "window of the steady state")
    for r in rows:
        ratios = " ".join("-" if q is None else f"{q:.2f}" for q in r.ratios)
        print(f"  {r.weights:>5} seed {r.seed}: target {r.target_ratio:g}, windows [{ratios}], "
              f"overall {r.mean_ratio if r.mean_ratio is not None else '-'}, worst deviation "
              + ("-" if r.worst_deviation is None else f"{100 * r.worst_deviation:.0f} %"))


def print_sheddable(rows: list[SheddableRow]) -> None:
    if not rows:
        return
    print("\nsheddable: chat (priority 0) and batch (priority -1), half the arrivals each, "
          "on 2L1H; goodput %, measured middle, mean over seeds")
    print(f"  {'variant':<26} {'QPS':>6} {'chat':>6} {'batch':>6} {'all':>6}")
    for r in rows:
        print(f"  {r.variant:<26} {r.qps:6.2f} {_pct(r.chat_goodput_pct):>6} "
              f"{_pct(r.batch_goodput_pct):>6} {_pct(r.goodput_pct):>6}")


def print_starvation(rows: list[StarvationRow]) -> None:
    if not rows:
        return
    print("\nstarvation: the longest wait for an answer, in TTFT targets and over "
          "max_wait_slo_multiple of them (must be <= 1 where the controller bounds waits)")
    for r in rows:
        multiple = "-" if r.max_wait_slo_multiple is None else f"{r.max_wait_slo_multiple:.2f}x"
        ratio = "-" if r.max_wait_ratio is None else f"{r.max_wait_ratio:.3f}"
        verdict = "ok" if r.ok else "OVER" if r.ok is False else "(no bound)"
        print(f"  {r.phase:<9} {r.label:<40} {r.variant:<16} {multiple:>8} {ratio:>7} {verdict}")


def weights_figure(rows: list[WeightsRow], runs: list[Run], path: Path) -> None:
    """Tenant a's share of the service in every window, per weights run (mean over
    seeds), the steady windows marked, the targets dotted."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    styles = {"2:1": ("tab:red", "o", "-"), "1:1": ("tab:blue", "s", "--")}
    for weights in dict.fromkeys(r.variant for r in runs if r.phase == "weights"):
        mine = [r for r in runs if r.phase == "weights" and r.variant == weights]
        n = max(len(r.service.get("a", [])) for r in mine)
        shares = []
        for k in range(n):
            values = [(r.service["a"][k], r.service["b"][k]) for r in mine
                      if k < len(r.service.get("a", [])) and k < len(r.service.get("b", []))
                      and r.service["a"][k] + r.service["b"][k] > 0]
            shares.append(sum(a / (a + b) for a, b in values) / len(values) if values else None)
        window = mine[0].window_s
        xs = [(k + 0.5) * window for k, s in enumerate(shares) if s is not None]
        ys = [s for s in shares if s is not None]
        color, marker, line = styles.get(weights, (None, "o", "-"))
        ax.plot(xs, ys, marker=marker, linestyle=line, color=color,
                label=f"weights {weights}: a's share")
        wa, wb = (float(w) for w in weights.split(":"))
        ax.axhline(wa / (wa + wb), color=color, linestyle=":", linewidth=1)
        first, last = mine[0].steady_windows
        ax.axvspan(first * window, last * window, color="gray", alpha=0.08)
    ax.set_ylim(0, 1)
    ax.set_xlabel("time (s); shaded: the steady state")
    ax.set_ylabel("tenant a's share of the service")
    ax.set_title("two backlogged tenants at 1.5 x capacity each, 2L1H (dotted: the weights)",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


# ---- the command --------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.tenants", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="write the results (JSON) here")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help="comma-separated, of " + ", ".join(PHASES) + " (default all)")
    parser.add_argument("--capacity", type=float, default=DEFAULT_CAPACITY,
                        help="the box's capacity C, QPS (default %(default)s: 2L1H on poisson "
                             "ShareGPT, a100-llama3-8b, docs/results.md)")
    parser.add_argument("--num-requests", type=int, default=None,
                        help="requests per flood and sheddable run (default 6000; --quick 800)")
    parser.add_argument("--weights-seconds", type=float, default=None,
                        help="seconds of arrivals per weights run (default 360; --quick 50)")
    parser.add_argument("--window", type=float, default=None,
                        help="seconds per service window (default 60; --quick 10)")
    parser.add_argument("--seeds", default=None, help="comma-separated (default 0,1,2; "
                                                      "--quick 0)")
    parser.add_argument("--quick", action="store_true",
                        help="one seed, short runs: a smoke test, not a measurement")
    parser.add_argument("--figures", type=Path, default=Path("docs/figures/tenants"),
                        help="folder of the weights figure (default %(default)s)")
    parser.add_argument("--profile", default=RulerConfig().profile, type=profile_argument,
                        help="a GPU profile or a profile file, at its own SLOs "
                             "(default %(default)s)")
    parser.add_argument("--max-model-len", type=int, default=RulerConfig().max_model_len)
    add_workers_flag(parser)
    args = parser.parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(phases) - set(PHASES)
    if unknown or not phases:
        parser.error(f"--phases {args.phases!r}: choose among {', '.join(PHASES)}")
    if not args.capacity > 0:
        parser.error(f"--capacity must be > 0, got {args.capacity}")
    n = args.num_requests or (800 if args.quick else 6000)
    seconds = args.weights_seconds or (50.0 if args.quick else 360.0)
    window = args.window or (10.0 if args.quick else 60.0)
    seeds = tuple(int(s) for s in (args.seeds or ("0" if args.quick else "0,1,2")).split(","))
    started = time.perf_counter()

    jobs: list[Job] = []
    if "flood" in phases:
        jobs += flood_jobs(args.capacity, seeds, n)
    if "weights" in phases:
        jobs += weights_jobs(args.capacity, seeds, seconds, window)
    if "sheddable" in phases:
        jobs += sheddable_jobs(args.capacity, seeds, n)
    if phases == ["starvation"]:
        jobs += starvation_jobs(args.capacity, seeds, n)
    jobs = [msgspec.structs.replace(j, profile=args.profile, max_model_len=args.max_model_len)
            for j in jobs]
    print(f"{len(jobs)} runs (capacity C = {args.capacity:g} QPS, seeds {list(seeds)})",
          file=sys.stderr)
    for key in dict.fromkeys((j.phase, j.variant if j.phase == "weights" else "") for j in jobs):
        job = next(j for j in jobs if (j.phase, j.variant if j.phase == "weights" else "") == key)
        print(f"  {' '.join(key).strip()}: {job.qps:.2f} QPS, {mix_text(job.mix, job.qps)}",
              file=sys.stderr)
    runs = run_parallel(run_job, jobs, args.workers)

    study = TenantsStudy(config={"capacity_qps": args.capacity, "num_requests": n,
                                 "weights_seconds": seconds, "window_s": window,
                                 "seeds": list(seeds), "phases": phases, "quick": args.quick,
                                 "profile": args.profile, "workload": "poisson",
                                 "trace": "sharegpt"}, runs=runs)
    study.flood = flood_summary(runs)
    study.weights = weights_summary(runs)
    study.sheddable = sheddable_summary(runs)
    if "starvation" in phases:
        study.starvation = starvation_summary(runs)
    print_flood(study.flood, args.capacity)
    print_weights(study.weights)
    print_sheddable(study.sheddable)
    print_starvation(study.starvation)
    if study.weights:
        figure = args.figures / "weights.png"
        try:
            weights_figure(study.weights, runs, figure)
            print(f"\nfigure written to {figure}")
        except ImportError:
            print("\nno figure: it needs matplotlib, which is in the `bench` extra: "
                  "pip install -e '.[bench]'", file=sys.stderr)
    study.wall_s = round(time.perf_counter() - started, 1)
    write_json(args.out, study)
    print(f"results written to {args.out} ({study.wall_s:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
