"""Tensor parallelism on one 8-GPU box: which degree, which layout (docs/tensor_parallel.md).

Two tables, each a list of `ascendra capacity` rows as bench/studies/results_tables.py
writes them (one capacity search per row and seed, bench/studies/results_run.py `search`):

* `tp70b` -- Llama-3-70B on 8 A100-80Gs (`a100-llama3-70b`, its own SLOs: the profile's
  SLO scale, engines/executors/profiles/slo_scale.py): 2 instances at tp 4 (Ascendra `2A`
  and `1L1H`, vLLM V0 and V1 at their tuned budgets with drops) and 1 at tp 8 (`1A` and
  the same baselines), on mixed-slo also 2A and 1A with the operator's class floor
  (`--class-floor 0.8`, docs/fairness.md); bursty-cv4's baselines search from 0.06 QPS
  down by halves (`LOW_START`); tp 2 (4 instances) is not a row: at tp 2 a rank holds
  21k tokens of KV beside its 65 GiB of weights, not one running batch of the ruler's
  prompts (its hardware ceiling is 0; `ascendra plan` skips it with that reason);
* `tp8b` -- Llama-3-8B on 8 A100s: 8 instances at tp 1 against 4 at tp 2, Ascendra (`8A`,
  `4A`) and each workload's best baseline of docs/results.md at both degrees.

Workloads poisson, bursty-cv4 and mixed-slo. Each finished search is appended to
`<out>/searches.jsonl` as it ends, so a run cut short keeps what it did and a rerun does
only the rest (seed by seed: every row at seed 0 first); `<out>/<table>.json`/`.md` are
the results_run table (each row over the seeds it has), and
`<out>/<table>.report.md` the comparison: per workload the best Ascendra row against the
best baseline row at any degree (capacity and fair capacity), the best of each degree,
and the per-class goodput (prompt-length quartile, SLO class) at each row's capacity.

    python -m bench.studies.tp_capacity --table tp70b --table tp8b --out DIR
        [--measured 1500] [--seeds 0,1,2] [--tolerance 0.05] [--workers 2] [--only REGEX]
    python -m bench.studies.tp_capacity --table tp70b --out DIR --report   # no searching
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import msgspec

from bench.parallel import imap_unordered
from bench.ruler.ruler import SeedCapacity
from bench.studies.results_run import (
    TableResult, _commit, row_command, row_result, search, utc_date, with_ratios, write,
)
from bench.studies.results_tables import Group, Protocol, Row, Table

WORKLOADS = ("poisson", "bursty-cv4", "mixed-slo")
#: The baselines at their tuned budgets, with drops (bench/studies/results_tables.py).
#: SGLang is left out for CPU time: at 70B it scheduled as vLLM V1 (at one rate, 600
#: requests: 73.0 vs 73.3 % goodput on poisson, 10.8 vs 11.0 % on bursty-cv4 at tp 4).
BASELINES = (("vLLM V0 @8192", "vllm-v0", "--chunk-size 8192 --drop-expired"),
             ("vLLM V1 @2048", "vllm-v1", "--chunk-size 2048 --drop-expired"))
#: docs/results.md's best baseline on each workload (8B, three instances).
BEST_8B_BASELINE = {"poisson": ("vLLM V0 @8192", "vllm-v0", "--chunk-size 8192 --drop-expired"),
                    "bursty-cv4": ("SGLang @4096 + RR", "sglang",
                                   "--chunk-size 4096 --drop-expired --routing round_robin"),
                    "mixed-slo": ("vLLM V0 @8192", "vllm-v0", "--chunk-size 8192 --drop-expired")}
PROFILE_70B = "--profile a100-llama3-70b"
PROFILE_8B = "--profile a100-llama3-8b"
REDUCED = Protocol(measured=1500, seeds=(0, 1, 2), tolerance=0.05)


#: Seed 0's capacity of each 70B row (docs/tensor_parallel.md, 2026-11-28): later seeds'
#: searches start there and step 5 % (`Row.start`), bracketing the edge in a few runs.
START_70B = {("poisson", "2A @tp4"): 3.95, ("poisson", "1A @tp8"): 3.01,
             ("poisson", "2x vLLM V1 @2048 @tp4"): 2.75, ("poisson", "1x vLLM V1 @2048 @tp8"): 2.28,
             ("poisson", "2x vLLM V0 @8192 @tp4"): 2.75, ("poisson", "1x vLLM V0 @8192 @tp8"): 2.48,
             ("poisson", "1L1H @tp4"): 3.54, ("bursty-cv4", "2A @tp4"): 0.147,
             ("mixed-slo", "2A @tp4"): 3.26, ("mixed-slo", "1A @tp8"): 2.95,
             ("mixed-slo", "2x vLLM V1 @2048 @tp4"): 2.46,
             ("mixed-slo", "1x vLLM V1 @2048 @tp8"): 2.23,
             ("mixed-slo", "2x vLLM V0 @8192 @tp4"): 2.83,
             ("mixed-slo", "1x vLLM V0 @8192 @tp8"): 2.50,
             ("mixed-slo", "2A --class-floor 0.8 @tp4"): 3.1,
             ("mixed-slo", "1A --class-floor 0.8 @tp8"): 2.8,
             ("mixed-slo", "2A --esp-max-degree 2 @tp4"): 3.26,   # 2A's (no seed of its own yet)
             ("mixed-slo", "2A --esp-max-degree 2 --class-floor 0.8 @tp4"): 3.1,
             ("mixed-slo", "2A --class-floor 0.8 --class-floor-by slo @tp4"): 3.1,
             ("mixed-slo", "1A --class-floor 0.8 --class-floor-by slo @tp8"): 2.8}
#: bursty-cv4's baselines held 90 % at no rate a search from the hardware ceiling reached
#: (16 rates, 1.25x apart, down to 0.073-0.084 QPS: 86.8-87.3 %), so theirs start under
#: that and halve (down to 1/64 of the start) until one holds.
LOW_START = "--start-qps 0.06 --start-growth 2"


def _group_70b(workload: str) -> Group:
    """The rows in the order they are searched (the decisive ones first)."""
    w = f"--workload {workload}"
    at = {4: f"{PROFILE_70B} --tp 4 {w}", 8: f"{PROFILE_70B} --tp 8 {w}"}
    low = f" {LOW_START}" if workload == "bursty-cv4" else ""
    (v0, v0_name, v0_flags), (v1, v1_name, v1_flags) = BASELINES
    rows = [Row("2A @tp4", f"--layout 2A {at[4]}"),
            Row("1A @tp8", f"--layout 1A {at[8]}"),
            Row(f"2x {v1} @tp4", f"--layout 2x{v1_name} {v1_flags} {at[4]}{low}"),
            Row(f"1x {v1} @tp8", f"--layout 1x{v1_name} {v1_flags} {at[8]}{low}"),
            Row(f"2x {v0} @tp4", f"--layout 2x{v0_name} {v0_flags} {at[4]}{low}"),
            Row(f"1x {v0} @tp8", f"--layout 1x{v0_name} {v0_flags} {at[8]}{low}"),
            Row("1L1H @tp4", f"--layout 1L1H {at[4]}")]
    if workload == "mixed-slo":     # the operator's class floor (docs/fairness.md)
        rows += [Row("2A --class-floor 0.8 @tp4", f"--layout 2A {at[4]} --class-floor 0.8"),
                 Row("1A --class-floor 0.8 @tp8", f"--layout 1A {at[8]} --class-floor 0.8"),
                 # ESP groups over the two tp-4 instances: an interactive prompt too long to
                 # prefill in time on one (over ~6,270 tokens) is striped over both
                 Row("2A --esp-max-degree 2 @tp4", f"--layout 2A {at[4]} --esp-max-degree 2"),
                 Row("2A --esp-max-degree 2 --class-floor 0.8 @tp4",
                     f"--layout 2A {at[4]} --esp-max-degree 2 --class-floor 0.8"),
                 # the floor over SLO classes: the interactive class, under it, served first
                 Row("2A --class-floor 0.8 --class-floor-by slo @tp4",
                     f"--layout 2A {at[4]} --class-floor 0.8 --class-floor-by slo"),
                 Row("1A --class-floor 0.8 --class-floor-by slo @tp8",
                     f"--layout 1A {at[8]} --class-floor 0.8 --class-floor-by slo")]
    return Group(workload, tuple(msgspec.structs.replace(r, start=START_70B.get((workload, r.label)))
                                 for r in rows))


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


class Search(msgspec.Struct, frozen=True):
    """One finished capacity search, as the cache keeps it."""
    flags: str
    measured: int
    tolerance: float
    seed: int
    result: SeedCapacity


def jobs_of(tables: list[Table], protocol: Protocol,
            only: str = "") -> list[tuple[str, int]]:
    """Every (row command, seed) of `tables` whose label matches `only`: seed by seed, and
    within a seed by the row's place in its group before its table and workload, so a run
    cut short has the first rows of every table and workload at the first seed."""
    depth = max(len(g.rows) for t in tables for g in t.groups)
    return [(row_command(g.rows[i], protocol), seed) for seed in protocol.seeds
            for i in range(depth) for t in tables for g in t.groups
            if i < len(g.rows) and re.search(only, f"{g.name} {g.rows[i].label}")]


def run(tables: list[Table], protocol: Protocol, out: Path, workers: int | None,
        only: str = "") -> None:
    """Every search of `tables` not yet in `out`'s cache, each cached as it ends."""
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "searches.jsonl"
    done = load_cache(cache, protocol)
    todo = [job for job in jobs_of(tables, protocol, only) if _key(job) not in done]
    print(f"{len(done)} searches cached, {len(todo)} to run", file=sys.stderr)
    with cache.open("ab") as f:
        for i, result in imap_unordered(search, todo, workers):
            command, seed = todo[i]
            flags = _key((command, seed))[0].split(" --measured ")[0].removeprefix(
                "ascendra capacity ")
            f.write(msgspec.json.encode(Search(flags, protocol.measured, protocol.tolerance,
                                               seed, result)) + b"\n")
            f.flush()
            print(f"{command} seed {seed}: capacity {_qps(result.capacity_qps)}, fair "
                  f"{_qps(result.fair_capacity_qps)}", file=sys.stderr, flush=True)


def _key(job: tuple[str, int]) -> tuple[str, int]:
    """A job as the cache names it: its command without where the search started (a start
    changes the runs a search takes, not what it finds)."""
    command, seed = job
    return re.sub(r"( --tolerance \S+) --start-qps \S+ --start-growth \S+$", r"\1", command), seed


def load_cache(path: Path, protocol: Protocol) -> dict[tuple[str, int], SeedCapacity]:
    """The cached searches of `protocol`'s measured count and tolerance, by (row command,
    seed) as `row_command(row, protocol)` names them."""
    if not path.exists():
        return {}
    lines = [msgspec.json.decode(b, type=Search) for b in path.read_bytes().splitlines() if b]
    return {(row_command(Row("", x.flags), protocol), x.seed): x.result for x in lines
            if (x.measured, x.tolerance) == (protocol.measured, protocol.tolerance)}


def report(table: Table, protocol: Protocol, out: Path,
           done: dict[tuple[str, int], SeedCapacity]) -> TableResult | None:
    """The table and its report from the searches done, written to `out`: each row over
    the seeds of `protocol` it has (a row with none is left out)."""
    groups = []
    for g in table.groups:
        rows = []
        for r in g.rows:
            command = _key((row_command(r, protocol), 0))[0]
            seeds = [done[(command, s)] for s in protocol.seeds if (command, s) in done]
            if seeds:
                shown = command.replace(f"--seeds {','.join(map(str, protocol.seeds))}",
                                        "--seeds " + ",".join(str(x.seed) for x in seeds))
                rows.append(row_result(r.label, shown, seeds))
        if rows:
            groups.append(with_ratios(g.name, rows))
    if not groups:
        return None
    doc = TableResult(name=table.name, title=table.title, command=f"python -m "
                      f"bench.studies.tp_capacity --table {table.name}", commit=_commit(),
                      date=utc_date(), protocol=protocol, full_protocol=Protocol(),
                      quick=False, groups=groups)
    write(doc, out)
    (out / f"{table.name}.report.md").write_text(comparison(doc))
    return doc


def comparison(doc: TableResult) -> str:
    """Per workload: best Ascendra row vs best baseline row, the best of each degree, and
    the classes' goodput at each row's capacity (mean over seeds)."""
    lines = [f"{doc.title}. {doc.date}, commit {doc.commit}; rows: `ascendra capacity FLAGS "
             f"--measured {doc.protocol.measured} --seeds "
             f"{','.join(map(str, doc.protocol.seeds))} --tolerance {doc.protocol.tolerance:g}`"
             " (a reduced protocol: the ruler's full one is 4,500 measured, tolerance 0.03).",
             "", "Capacity: the best row's (chosen on the seeds every row has; its mean over all "
             "its seeds, how many in brackets); fair capacity: the best row's by fair "
             "capacity, which may be another row (named). "
             "Per seed: the same two rows' ratio on each seed both have.", "",
             "| workload | best Ascendra | capacity | fair | best baseline | capacity | fair "
             "| ratio | per seed | fair ratio | per seed |",
             "|---|---|---:|---:|---|---:|---:|---:|---|---:|---|"]
    for g in doc.groups:
        ours = [r for r in g.rows if is_ascendra(r.label)]
        theirs = [r for r in g.rows if not is_ascendra(r.label)]
        if not ours or not theirs:
            continue
        # chosen on the seeds every row has (rows searched on more seeds are no better
        # for it), ties by the mean over all of a row's seeds
        common = set.intersection(*({s.seed for s in r.seeds} for r in g.rows))

        def best(rows, field, mean):
            return max(rows, key=lambda r: (sum(getattr(s, field) for s in r.seeds
                                                if s.seed in common), getattr(r, mean)))
        a, b = (best(x, "capacity_qps", "mean_qps") for x in (ours, theirs))
        fa, fb = (best(x, "fair_capacity_qps", "fair_mean_qps") for x in (ours, theirs))
        lines.append(f"| {g.name} | {_named(a)} | {_qps(a.mean_qps)} | {_fair(fa, a)} | "
                     f"{_named(b)} | {_qps(b.mean_qps)} | {_fair(fb, b)} | "
                     f"{_ratio(a.mean_qps, b.mean_qps)} | {_per_seed(a, b, 'capacity_qps')} | "
                     f"{_ratio(fa.fair_mean_qps, fb.fair_mean_qps)} | "
                     f"{_per_seed(fa, fb, 'fair_capacity_qps')} |")
    lines += ["", "Per class, at each row's capacity (goodput %, mean over the seeds; prompt "
              "Q1-Q4 are the workload's prompt-length quartiles, Q1 the shortest):", ""]
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
            lines.append(f"| {r.label} | {_qps(r.mean_qps)} [{_qps(r.min_qps)}-"
                         f"{_qps(r.max_qps)}] | {_qps(r.fair_mean_qps)} | {cells} |")
        lines.append("")
    return "\n".join(lines)


def _classes_at_capacity(seeds: list[SeedCapacity]) -> dict[str, float]:
    """Each class's goodput at the highest rate that held (the capacity), mean over the
    seeds that have one. Prompt-length quartiles are named by rank (Q1 the shortest):
    each seed's requests draw their own bounds."""
    sums: dict[str, list[float]] = {}
    for s in seeds:
        held = max((p for p in s.points if p.holds), key=lambda p: p.qps, default=None)
        quartile = 0
        for c in (held.classes if held else []):
            name = c.name
            if name.startswith("prompt "):
                quartile += 1
                name = f"prompt Q{quartile}"
            sums.setdefault(name, []).append(c.goodput_pct)
    return {name: sum(v) / len(v) for name, v in sums.items()}


def _fair(best_fair, best) -> str:
    """The best fair capacity, naming its row when it is not the best-capacity row's."""
    return _qps(best_fair.fair_mean_qps) + ("" if best_fair is best else
                                                f" ({_named(best_fair)})")


def _named(row) -> str:
    """A row's label and how many seeds its mean is over."""
    return f"{row.label} [{len(row.seeds)}]"


def _per_seed(a, b, field: str) -> str:
    """`a`'s over `b`'s `field` on each seed both rows have ("s0 1.44x, ...")."""
    ours = {s.seed: getattr(s, field) for s in a.seeds}
    theirs = {s.seed: getattr(s, field) for s in b.seeds}
    return ", ".join(f"s{seed} {_ratio(ours[seed], theirs[seed])}"
                     for seed in sorted(ours.keys() & theirs.keys())) or "-"


def _qps(x: float) -> str:
    """A rate at two decimals, or three under 1 QPS (bursty-cv4's 70B rates: 0.043)."""
    return f"{x:.2f}" if x >= 1 else f"{x:.3f}"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.studies.tp_capacity",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--table", choices=sorted(TABLES), action="append", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--measured", type=int, default=REDUCED.measured)
    p.add_argument("--seeds", default=",".join(map(str, REDUCED.seeds)))
    p.add_argument("--tolerance", type=float, default=REDUCED.tolerance)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--only", default="",
                   help="run only the rows whose \"workload label\" matches (a regex)")
    p.add_argument("--report", action="store_true", help="write the report of what is cached")
    args = p.parse_args(argv)
    tables = [TABLES[name] for name in args.table]
    protocol = Protocol(measured=args.measured, tolerance=args.tolerance,
                        seeds=tuple(int(s) for s in args.seeds.split(",")))
    out = Path(args.out)
    if not args.report:
        run(tables, protocol, out, args.workers, args.only)
    done = load_cache(out / "searches.jsonl", protocol)
    for table in tables:
        doc = report(table, protocol, out, done)
        if doc is not None:
            print(comparison(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
