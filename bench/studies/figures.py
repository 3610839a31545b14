"""Plots for bench/studies/reproduce.py: one PNG per figure document (matplotlib, Agg backend)."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench.studies.fleet_figure import fleet_figure  # noqa: E402

COLORS = {"2L1H": "tab:red", "3xsarathi": "tab:blue", "3xvllm-v0": "tab:green",
          "3xvllm-v1": "tab:olive", "3xsglang": "tab:purple",
          "1L1H": "tab:red", "2xsarathi": "tab:blue", "2xvllm-v0": "tab:green",
          "1L2H": "tab:purple", "2L1H-sjf": "tab:orange", "2L1H-edf": "tab:red",
          "2L1H-fcfs": "tab:gray", "elastic-on": "tab:red", "elastic-off": "tab:gray"}
DPI = 90


def draw(doc: dict, path: str | Path) -> None:
    fig = globals()[f"_{doc['figure']}"](doc)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)


def _series(rows, x: str, y: str, where=lambda r: True) -> dict[str, tuple[list, list]]:
    """label -> (xs, ys), sorted by x; rows with equal label and x are averaged."""
    acc: dict[str, dict[float, list]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if where(r):
            acc[r["label"]][r[x]].append(r[y])
    return {label: (sorted(pts), [sum(pts[k]) / len(pts[k]) for k in sorted(pts)])
            for label, pts in acc.items()}


def _lines(ax, series, xlabel, ylabel, title, target=None):
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label, color=COLORS.get(label))
    if target is not None:
        ax.axhline(target, color="gray", linestyle="--", linewidth=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _fig9(doc):
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    rows = doc["rows"]
    for col, trace in enumerate(("sharegpt", "arxiv")):
        ttft = doc["ttft_slo"][trace]
        qps_rows = [r for r in rows if r["trace"] == trace and "@slo" not in r["label"]]
        _lines(axes[0][col], _series(qps_rows, "qps", "goodput_pct"), "QPS", "goodput (%)",
               f"{trace}: goodput vs load (TTFT {ttft} s, TBT {doc['tbt_slo']} s)", target=90)
        slo_rows = [dict(r, scale=r["ttft_slo"] / ttft, label=r["label"].split("@")[0])
                    for r in rows if r["trace"] == trace and "@slo" in r["label"]]
        _lines(axes[1][col], _series(slo_rows, "scale", "goodput_pct"),
               "SLO scale (x Table 2 TTFT and TBT)", "goodput (%)",
               f"{trace}: goodput vs SLO at {doc['fixed_qps'][trace]} QPS", target=90)
        axes[1][col].set_xscale("log", base=2)
    fig.suptitle(f"Figure 9 (simulated, {doc['profile']}, {doc['num_requests']} requests/point)")
    fig.tight_layout()
    return fig


def _fig10(doc):
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.6))
    metrics = [("p99_ttft_s", "(a) P99 TTFT (s)"), ("mean_tbt_s", "(b) mean TBT (s)"),
               ("throughput", "(c) throughput (req/s)"), ("sched_delay_s", "(d) sched. delay (s)")]
    names, values, colors = [], defaultdict(list), []
    for row in doc["rows"]:
        for inst in row["per_instance"]:
            names.append(f"{inst['role']}{inst['id']}")
            colors.append(COLORS.get(row["layout"], "gray"))
            for key, _ in metrics:
                if key == "throughput":
                    value = inst["served"] / row["duration_s"] if row["duration_s"] else 0
                else:
                    value = inst[key]
                values[key].append(value or 0.0)
    for ax, (key, title) in zip(axes, metrics):
        ax.bar(range(len(names)), values[key], color=colors)
        ax.set_xticks(range(len(names)), names, fontsize=7, rotation=90)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        if key == "p99_ttft_s":
            ax.axhline(doc["ttft_slo"]["sharegpt"], color="gray", linestyle="--", linewidth=1)
        if key == "mean_tbt_s":
            ax.axhline(doc["tbt_slo"], color="gray", linestyle="--", linewidth=1)
    from matplotlib.patches import Patch
    layouts = [row["layout"] for row in doc["rows"]]
    axes[0].legend(handles=[Patch(color=COLORS.get(name, "gray"), label=name) for name in layouts],
                   fontsize=8)
    fig.suptitle(f"Figure 10: per instance, ShareGPT at {doc['qps']} QPS "
                 f"({doc['num_requests']} requests)")
    fig.tight_layout()
    return fig


def _two_goodput_panels(doc, title: str, panels) -> plt.Figure:
    """Goodput vs QPS side by side; `panels` is two (row filter, panel title) pairs."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, (where, panel_title) in zip(axes, panels):
        _lines(ax, _series(doc["rows"], "qps", "goodput_pct", where), "QPS", "goodput (%)",
               panel_title, target=90)
    fig.suptitle(f"{title} ({doc['num_requests']} requests/point)")
    fig.tight_layout()
    return fig


def _fig11(doc):
    return _two_goodput_panels(doc, "Figure 11", [
        (lambda r: "elastic" not in r["label"], "2L1H, ShareGPT: value function"),
        (lambda r: "elastic" in r["label"], "2L1H, ShareGPT: HP elastic batch")])


def _fig12(doc):
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    rows = doc["rows"]
    labels = [r["layout"] for r in rows]
    parts = [("good", "within SLO", "tab:green"), ("slo_missed", "completed, SLO missed",
                                                   "tab:orange"),
             ("dropped", "dropped", "tab:gray")]
    bottom = [0] * len(rows)
    for key, name, color in parts:
        vals = [r[key] for r in rows]
        ax.bar(labels, vals, bottom=bottom, label=name, color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, r in enumerate(rows):
        ax.text(i, r["good"] / 2, str(r["good"]), ha="center", fontsize=9)
    ax.set_ylabel("requests")
    ax.set_title(f"Figure 12: {doc['minutes']} min at {doc['qps']} QPS (ShareGPT), drops on",
                 fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def _fig13(doc):
    return _two_goodput_panels(doc, "Figure 13", [
        (lambda r: r["trace"] == "arxiv", "two instances, arxiv (TTFT 2.5 s)"),
        (lambda r: r["trace"] == "sharegpt", "three instances, ShareGPT: 2L1H vs 1L2H (2H1L)")])


def _threshold(doc):
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    rows = doc["rows"]
    for q in sorted({r["qps"] for r in rows}):
        xs, ys = [], []
        for t in doc["thresholds"]:
            pts = [r["goodput_pct"] for r in rows if r["qps"] == q and r["offload_threshold"] == t]
            if pts:
                xs.append(t)
                ys.append(sum(pts) / len(pts))
        ax.plot(xs, ys, marker="o", label=f"{q} QPS")
    ax.set_xlabel("offload threshold (x worst-case HP latency)")
    ax.set_ylabel("goodput (%)")
    ax.set_title(f"2L1H, ShareGPT: offload threshold ({doc['num_requests']} req, seeds averaged)",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _capacity(doc):
    """One group of bars per workload: each row's mean capacity with its seeds' min-max,
    its fair capacity (every class at the floor) as a mark, and the ceilings as lines."""
    tables = doc["tables"]
    labels = [r["label"] for r in tables[0]["rows"]]
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(tables) * len(labels) / 3), 4))
    width = 0.8 / len(labels)
    for k, label in enumerate(labels):
        xs, means, lows, highs, fair = [], [], [], [], []
        for i, table in enumerate(tables):
            row = next(r for r in table["rows"] if r["label"] == label)
            xs.append(i + (k - (len(labels) - 1) / 2) * width)
            means.append(row["mean_qps"])
            fair.append(row.get("fair_mean_qps"))
            lows.append(row["mean_qps"] - row["min_qps"])
            highs.append(row["max_qps"] - row["mean_qps"])
        upstream, drops = "upstream" in label, "drops" in label
        ax.bar(xs, means, width, yerr=[lows, highs], label=label, capsize=2,
               color=COLORS.get(label.split(" ")[0]), alpha=0.45 if upstream else 1.0,
               hatch="//" if upstream else ".." if drops else None)
        if all(f is not None for f in fair):
            ax.scatter(xs, fair, marker="_", s=60, color="black", zorder=3,
                       label="fair capacity" if k == 0 else None)
    for i, table in enumerate(tables):
        lines = [table["ceiling_qps"], table["ceiling_90_qps"], table.get("fair_ceiling_qps")]
        ax.hlines([q for q in lines if q is not None], i - 0.45, i + 0.45,
                  colors=["black", "gray", "tab:red"][:sum(q is not None for q in lines)],
                  linestyles=["-", ":", "--"][:sum(q is not None for q in lines)], linewidth=1)
    ax.set_xticks(range(len(tables)), [t["workload"] for t in tables])
    ax.set_ylabel(f"QPS at {doc['target_pct']:.0f}% goodput (steady state)")
    ax.set_title(f"Capacity, {doc['profile']}, mean over seeds (min-max); lines: hardware "
                 "ceiling (all served, solid; cheapest 90 %, dotted; fair, dashed); marks: fair "
                 "capacity", fontsize=9)
    ax.legend(fontsize=7, ncol=3, loc="upper right")
    fig.tight_layout()
    return fig

def _ablation(doc):
    """Capacity per variant, one group per workload."""
    rows = doc["rows"]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 3.8))
    width = 0.8 / len(variants)
    for k, variant in enumerate(variants):
        xs = [i + (k - (len(variants) - 1) / 2) * width for i in range(len(workloads))]
        values = [next(r["capacity_qps"] for r in rows
                       if r["workload"] == w and r["variant"] == variant) for w in workloads]
        ax.bar(xs, values, width, label=variant)
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel("QPS at 90% goodput (steady state, seed 0)")
    ax.set_title(TITLES[doc["figure"]], fontsize=10)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    return fig


TITLES = {"ablation": "What each part of Ascendra's policy earns (2L1H with one part off)",
          "values": "2L1H by the LP instances' value function"}
_values = _ablation
_fleet = fleet_figure
