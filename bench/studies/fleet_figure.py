"""The fleet scaling figure: goodput vs load, one panel per box kind, one line per fleet
size and picker (mean over seeds, min-max as error bars), from a `FleetScaling` document."""
from __future__ import annotations

import matplotlib.pyplot as plt

#: Line colour per fleet size, style per picker.
SIZE_COLORS = {1: "black", 4: "tab:blue", 16: "tab:red"}
PICKER_STYLES = {"none": "-", "epp": "-", "least_queue": "--", "round_robin": ":"}


def fleet_figure(doc: dict) -> plt.Figure:
    kinds = doc["config"]["kinds"]
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 4), sharey=True,
                             squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        lines: dict[tuple, list[dict]] = {}
        for row in doc["rows"]:
            if row["kind"] == kind["label"]:
                lines.setdefault((row["boxes"], row["picker"]), []).append(row)
        for (boxes, picker), rows in lines.items():
            rows = sorted(rows, key=lambda r: r["load"])
            means = [r["mean_goodput_pct"] for r in rows]
            ax.errorbar([r["load"] for r in rows], means,
                        yerr=[[m - r["min_goodput_pct"] for m, r in zip(means, rows)],
                              [r["max_goodput_pct"] - m for m, r in zip(means, rows)]],
                        marker="o", capsize=2, color=SIZE_COLORS.get(boxes),
                        linestyle=PICKER_STYLES.get(picker, "-"),
                        label=f"{boxes} box{'es' if boxes > 1 else ''}, {picker}")
        ax.axhline(doc["config"]["ruler"]["target"], color="gray", linestyle="--", linewidth=1)
        ax.set_xlabel("load per box (x one box's capacity)")
        ax.set_title(f"{kind['label']} boxes ({kind['subject']['layout']}, one holds "
                     f"{kind['capacity_qps']:g} QPS)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("goodput %, measured middle")
    fig.tight_layout()
    return fig
