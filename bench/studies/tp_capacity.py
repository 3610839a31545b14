"""Tensor parallelism on one 8-GPU box: which degree, which layout (docs/tensor_parallel.md).

Two tables, each a list of `ascendra capacity` rows as bench/studies/results_tables.py
writes them (one capacity search per row and seed, bench/studies/results_run.py `search`):

* `tp70b` -- Llama-3-70B on 8 A100-80Gs (`a100-llama3-70b`, its own SLOs: the profile's
  SLO scale, engines/executors/profiles/slo_scale.py): 2 instances at tp 4 (Ascendra `2A`
  and `1L1H`, vLLM V0 / V1 and SGLang at their tuned budgets with drops) and 1 at tp 8
  (`1A`, vLLM V0 and V1; SGLang left out there for CPU time: on one instance it
  schedules as vLLM V1 at a larger budget); tp 2 (4 instances) is not a row: at tp 2 a rank holds
  21k tokens of KV beside its 65 GiB of weights, not one running batch of the ruler's
  prompts (its hardware ceiling is 0; `ascendra plan` skips it with that reason);
* `tp8b` -- Llama-3-8B on 8 A100s: 8 instances at tp 1 against 4 at tp 2, Ascendra (`8A`,
  `4A`) and each workload's best baseline of docs/results.md at both degrees.

Workloads poisson, bursty-cv4 and mixed-slo. Each finished search is appended to
`<out>/<table>.searches.jsonl` as it ends, so a run cut short keeps what it did and a
rerun does only the rest; `<out>/<table>.json`/`.md` are the results_run table, and
`<out>/<table>.report.md` the comparison: per workload the best Ascendra row against the
best baseline row at any degree (capacity and fair capacity), the best of each degree,
and the per-class goodput (prompt-length quartile, SLO class) at each row's capacity.

    python -m bench.studies.tp_capacity --table tp70b --out DIR [--measured 1500]
        [--seeds 0,1,2] [--tolerance 0.05] [--workers 2]
    python -m bench.studies.tp_capacity --table tp70b --out DIR --report   # no searching
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

from bench.parallel import imap_unordered
from bench.ruler.ruler import SeedCapacity
from bench.studies.results_run import (
    TableResult, _commit, assemble, row_command, search, write,
)
from bench.studies.results_tables import Group, Protocol, Row, Table

WORKLOADS = ("poisson", "bursty-cv4", "mixed-slo")
#: The baselines at their tuned budgets, with drops (bench/studies/results_tables.py).
BASELINES = (("vLLM V0 @8192", "vllm-v0", "--chunk-size 8192 --drop-expired"),
             ("vLLM V1 @2048", "vllm-v1", "--chunk-size 2048 --drop-expired"),
             ("SGLang @4096", "sglang", "--chunk-size 4096 --drop-expired"))
#: docs/results.md's best baseline on each workload (8B, three instances).
BEST_8B_BASELINE = {"poisson": ("vLLM V0 @8192", "vllm-v0", "--chunk-size 8192 --drop-expired"),
                    "bursty-cv4": ("SGLang @4096 + RR", "sglang",
                                   "--chunk-size 4096 --drop-expired --routing round_robin"),
                    "mixed-slo": ("vLLM V0 @8192", "vllm-v0", "--chunk-size 8192 --drop-expired")}
PROFILE_70B = "--profile a100-llama3-70b"
PROFILE_8B = "--profile a100-llama3-8b"
REDUCED = Protocol(measured=1500, seeds=(0, 1, 2), tolerance=0.05)


def _group_70b(workload: str) -> Group:
    w = f"--workload {workload}"
    rows = [Row("2A @tp4", f"--layout 2A {PROFILE_70B} --tp 4 {w}"),
            Row("1L1H @tp4", f"--layout 1L1H {PROFILE_70B} --tp 4 {w}"),
            Row("1A @tp8", f"--layout 1A {PROFILE_70B} --tp 8 {w}")]
    for tp, n, baselines in ((4, 2, BASELINES), (8, 1, BASELINES[:2])):
        rows += [Row(f"{n}x {label} @tp{tp}", f"--layout {n}x{name} {flags} {PROFILE_70B} "
                                             f"--tp {tp} {w}")
                 for label, name, flags in baselines]
    return Group(workload, tuple(rows))


def _group_8b(workload: str) -> Group:
    w = f"--workload {workload}"
    label, name, flags = BEST_8B_BASELINE[workload]
    return Group(workload, (
        Row("8A @tp1", f"--layout 8A {PROFILE_8B} {w}"),
        Row("4A @tp2", f"--layout 4A {PROFILE_8B} --tp 2 {w}"),
        Row(f"8x {label} @tp1", f"--layout 8x{name} {flags} {PROFILE_8B} {w}"),
        Row(f"4x {label} @tp2", f"--layout 4x{name} {flags} {PROFILE_8B} --tp 2 {w}")))


TABLES: dict[str, Table] = {t.name: t for t in (
    Table("tp70b", "Tensor parallelism", "Llama-3-70B on 8 A100s: 2 instances at tp 4 or 1 at "
          "tp 8, Ascendra against the baselines (the 70B's own SLOs)",
          tuple(_group_70b(w) for w in WORKLOADS), REDUCED),
    Table("tp8b", "Tensor parallelism", "Llama-3-8B on 8 A100s: 8 instances at tp 1 against "
          "4 at tp 2, Ascendra and the best baseline",
          tuple(_group_8b(w) for w in WORKLOADS), REDUCED),
)}


def is_ascendra(label: str) -> bool:
    """A row of an Ascendra layout (`<n>A`, `<n>L<m>H`), not a baseline's (`<n>x ...`)."""
    return "x " not in label.split("@")[0]


def jobs_of(table: Table, protocol: Protocol) -> list[tuple[str, int]]:
    """Every (row command, seed), a row's place before its workload: a run cut short has
    the first rows of every workload rather than every row of the first workload."""
    depth = max(len(g.rows) for g in table.groups)
    return [(row_command(g.rows[i], protocol), seed) for i in range(depth)
            for g in table.groups if i < len(g.rows) for seed in protocol.seeds]


def run(table: Table, protocol: Protocol, out: Path, workers: int | None) -> TableResult:
    """Every search of `table` not yet in `out`'s cache, then the table and its report."""
    out.mkdir(parents=True, exist_ok=True)
    cache = out / f"{table.name}.searches.jsonl"
    done = load_cache(cache)
    todo = [job for job in jobs_of(table, protocol) if job not in done]
    print(f"{table.name}: {len(done)} searches cached, {len(todo)} to run", file=sys.stderr)
    with cache.open("ab") as f:
        for i, result in imap_unordered(search, todo, workers):
            done[todo[i]] = result
            f.write(msgspec.json.encode({"command": todo[i][0], "seed": todo[i][1],
                                         "result": result}) + b"\n")
            f.flush()
            print(f"[{len(done)}] {todo[i][0]} seed {todo[i][1]}: capacity "
                  f"{result.capacity_qps:.2f}, fair {result.fair_capacity_qps:.2f}",
                  file=sys.stderr, flush=True)
    return report(table, protocol, out, done)


def load_cache(path: Path) -> dict[tuple[str, int], SeedCapacity]:
    if not path.exists():
        return {}

    class Line(msgspec.Struct):
        command: str
        seed: int
        result: SeedCapacity

    lines = [msgspec.json.decode(b, type=Line) for b in path.read_bytes().splitlines() if b]
    return {(x.command, x.seed): x.result for x in lines}


def report(table: Table, protocol: Protocol, out: Path,
           done: dict[tuple[str, int], SeedCapacity]) -> TableResult | None:
    """Write the table and its report from the searches done (the rows with every seed)."""
    complete = Table(table.name, table.question, table.title, tuple(
        Group(g.name, rows) for g in table.groups
        if (rows := tuple(r for r in g.rows if all(
            (row_command(r, protocol), s) in done for s in protocol.seeds)))), protocol)
    if not complete.groups:
        return None
    doc = assemble(complete, protocol, done, False, _commit(), _today())
    write(doc, out)
    (out / f"{table.name}.report.md").write_text(comparison(doc))
    return doc


def _today() -> str:
    import datetime
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def comparison(doc: TableResult) -> str:
    """Per workload: best Ascendra row vs best baseline row, the best of each degree, and
    the classes' goodput at each row's capacity (mean over seeds)."""
    lines = [f"{doc.title}. {doc.date}, commit {doc.commit}; rows: `ascendra capacity FLAGS "
             f"--measured {doc.protocol.measured} --seeds "
             f"{','.join(map(str, doc.protocol.seeds))} --tolerance {doc.protocol.tolerance:g}`"
             " (a reduced protocol: the ruler's full one is 4,500 measured, tolerance 0.03).",
             "", "| workload | best Ascendra | capacity | fair | best baseline | capacity | fair "
             "| ratio | fair ratio |", "|---|---|---:|---:|---|---:|---:|---:|---:|"]
    for g in doc.groups:
        ours = [r for r in g.rows if is_ascendra(r.label)]
        theirs = [r for r in g.rows if not is_ascendra(r.label)]
        if not ours or not theirs:
            continue
        a = max(ours, key=lambda r: (r.mean_qps, r.fair_mean_qps))
        b = max(theirs, key=lambda r: (r.mean_qps, r.fair_mean_qps))
        fa = max(r.fair_mean_qps for r in ours)
        fb = max(r.fair_mean_qps for r in theirs)
        lines.append(f"| {g.name} | {a.label} | {a.mean_qps:.2f} | {fa:.2f} | {b.label} | "
                     f"{b.mean_qps:.2f} | {fb:.2f} | {_ratio(a.mean_qps, b.mean_qps)} | "
                     f"{_ratio(fa, fb)} |")
    lines += ["", "Per class, at each row's capacity (goodput %, mean over the seeds; prompt "
              "classes are the workload's prompt-length quartiles):", ""]
    for g in doc.groups:
        names = []
        for r in g.rows:
            for c in _classes_at_capacity(r.seeds):
                names += [c] if c not in names else []
        lines += [f"**{g.name}**", "", "| row | capacity | fair | " + " | ".join(names) + " |",
                  "|---|---:|---:|" + "---:|" * len(names)]
        for r in g.rows:
            per = _classes_at_capacity(r.seeds)
            cells = " | ".join(f"{per[n]:.1f}" if n in per else "-" for n in names)
            lines.append(f"| {r.label} | {r.mean_qps:.2f} [{r.min_qps:.2f}-{r.max_qps:.2f}] | "
                         f"{r.fair_mean_qps:.2f} | {cells} |")
        lines.append("")
    return "\n".join(lines)


def _classes_at_capacity(seeds: list[SeedCapacity]) -> dict[str, float]:
    """Each class's goodput at the highest rate that held, mean over the seeds that have one."""
    sums: dict[str, list[float]] = {}
    for s in seeds:
        held = [p for p in s.points if p.holds and abs(p.qps - s.capacity_qps) < 1e-9]
        for c in (held[0].classes if held else []):
            sums.setdefault(c.name, []).append(c.goodput_pct)
    return {name: sum(v) / len(v) for name, v in sums.items()}


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.studies.tp_capacity",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--table", choices=sorted(TABLES), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--measured", type=int, default=REDUCED.measured)
    p.add_argument("--seeds", default=",".join(map(str, REDUCED.seeds)))
    p.add_argument("--tolerance", type=float, default=REDUCED.tolerance)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--report", action="store_true", help="write the report of what is cached")
    args = p.parse_args(argv)
    table = TABLES[args.table]
    protocol = Protocol(measured=args.measured, tolerance=args.tolerance,
                        seeds=tuple(int(s) for s in args.seeds.split(",")))
    out = Path(args.out)
    doc = (report(table, protocol, out, load_cache(out / f"{table.name}.searches.jsonl"))
           if args.report else run(table, protocol, out, args.workers))
    if doc is not None:
        print(comparison(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
