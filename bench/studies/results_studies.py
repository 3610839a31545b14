"""The tables of docs/results.md that studies of their own make (`StudyTable`,
bench/studies/results_tables.py): run one as its own `python -m` command into
`<out>/<name>/`, and write `<out>/<name>.json` (a `StudyResult`: the stamp and the study's
own JSON) and `<out>/<name>.md` (the table as docs/results.md shows it).
"""
from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec

from bench.json_file import write_json
from bench.ruler.capacity_table import SWEEPS
from bench.studies.results_profile import ProfileTarget
from bench.studies.results_tables import StudyTable


class StudyResult(msgspec.Struct, kw_only=True):
    name: str
    title: str
    command: str                # the command that regenerates this table
    study_command: str          # the study's own command, as run
    commit: str
    date: str
    quick: bool
    returncode: int
    data: msgspec.Raw           # the study's own JSON, as it wrote it


class ProfiledStudyResult(StudyResult, kw_only=True):
    """A study run on another profile than the one it was set for (`--profile`)."""
    target: ProfileTarget


def run_study(study: StudyTable, out: Path, quick: bool, workers: int | None,
              stamp: tuple[str, str], table_command: str,
              target: ProfileTarget | None = None) -> Path:
    """Run the study into `out/<name>/` (its printout in `log.txt`), then write its table
    (`target`: on another profile)."""
    folder = out / study.name
    folder.mkdir(parents=True, exist_ok=True)
    command = study.command(quick, str(folder), target)
    argv = [sys.executable, *shlex.split(command)[1:]]
    if workers and study.takes_workers:
        argv += ["--workers", str(workers)]
    with open(folder / "log.txt", "w") as log:
        returncode = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT).returncode
    data = folder / study.data_file
    data = data.read_bytes() if data.exists() else b"null"
    fields = dict(name=study.name, title=study.title, command=table_command,
                  study_command=command, commit=stamp[0], date=stamp[1], quick=quick,
                  returncode=returncode, data=msgspec.Raw(data))
    doc = (ProfiledStudyResult(**fields, target=target) if target
           else StudyResult(**fields))
    write_json(out / f"{study.name}.json", doc, indent=1)
    md = out / f"{study.name}.md"
    md.write_text(render_study(doc))
    return md


def render_study(doc: StudyResult) -> str:
    lines = [f"{doc.title}. Measured {doc.date} on commit {doc.commit}: `{doc.command}` "
             f"(runs `{doc.study_command}`).", ""]
    if isinstance(doc, ProfiledStudyResult):
        lines += [doc.target.describe(), ""]
    if doc.quick:
        lines += ["**Quick run (`--quick`): a smoke test, not a measurement.**", ""]
    if doc.returncode:
        lines += [f"**The study exited with status {doc.returncode}** (its log: "
                  f"`{doc.name}/log.txt`).", ""]
    data = msgspec.json.decode(doc.data)
    return "\n".join(lines + (RENDERERS[doc.name](data) if data is not None else [])) + "\n"


def render_overload(data: dict) -> list[str]:
    """Per load: 3A's good requests per second against the best baseline's, and each's
    goodput by prompt-length quartile."""
    lines = ["| load | 3A good/s | best baseline good/s | 3A by quartile, % | "
             "best baseline by quartile, % |", "|---|---|---|---|---|"]
    for qps, load in data["rates"]:
        rows = [r for r in data["rows"] if r["qps"] == round(qps, 3)]
        mine = next(r for r in rows if r["layout"] == "3A")
        best = max((r for r in rows if r["layout"].split("@")[0] in SWEEPS),
                   key=lambda r: r["good_per_s"])
        lines.append(f"| {load:g}x ({qps:.2f}) | {mine['good_per_s']:.2f} | "
                     f"{best['layout']} {best['good_per_s']:.2f} | {_quartiles(mine)} | "
                     f"{_quartiles(best)} |")
    lost = sum(r["lost"] for r in data["rows"])
    return lines + ["", f"Requests lost, every row: {lost}."]


def _quartiles(row: dict) -> str:
    return " / ".join(f"{v:.0f}" for v in row["quartile_goodput_pct"].values())


def render_tenants(data: dict) -> list[str]:
    """The flood (per tenant, and the same requests sent as one tenant) and the sheddable
    phase; the weights' windows and the starvation check are in the JSON."""
    capacity = data["config"]["capacity_qps"]
    lines = [f"Flood: `heavy` at 3 x C and `light` at 0.2 x C (C = {capacity:g} QPS), equal "
             "weights; goodput %, the measured middle, mean over seeds "
             f"{','.join(str(s) for s in data['config']['seeds'])}.", "",
             "| row | heavy | light | total | one tenant | light, one tenant |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['label']} | {r['heavy_goodput_pct']:.1f} | {r['light_goodput_pct']:.1f} "
              f"| {r['total_goodput_pct']:.1f} | {r['one_tenant_goodput_pct']:.1f} "
              f"| {r['one_tenant_light_goodput_pct']:.1f} |" for r in data["flood"]]
    if data["sheddable"]:
        lines += ["", "Sheddable: `chat` (priority 0) and `batch` (priority -1), half the "
                  "arrivals each, 2L1H; goodput %.", "",
                  "| variant | QPS | chat | batch | all |", "|---|---|---|---|---|"]
        lines += [f"| {r['variant']} | {r['qps']:.2f} | {_pct(r['chat_goodput_pct'])} "
                  f"| {_pct(r['batch_goodput_pct'])} | {_pct(r['goodput_pct'])} |"
                  for r in data["sheddable"]]
    return lines


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render_live(data: dict) -> list[str]:
    lines = ["| workload | QPS | goodput live | simulated | difference | TTFT p50 live / sim |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['workload']} | {r['qps']:g} | {r['goodput_live_pct']:.1f} % | "
              f"{r['goodput_sim_pct']:.1f} % | "
              f"{r['goodput_live_pct'] - r['goodput_sim_pct']:+.1f} | "
              f"{1000 * r['ttft_p50_live_s']:.0f} / {1000 * r['ttft_p50_sim_s']:.0f} ms |"
              for r in data["rows"]]
    lost = sum(r["lost_live"] + r["lost_sim"] for r in data["rows"])
    return lines + ["", f"Layout {data['layout']}; requests lost, live and simulated: {lost}."]


RENDERERS: dict[str, Callable[[dict], list[str]]] = {
    "overload": render_overload, "tenants": render_tenants, "live": render_live}