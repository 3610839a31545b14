"""`ascendra reproduce results`: run docs/results.md's tables (bench/studies/results_tables.py)
and write each as `<out>/<name>.json` (a `TableResult`) and `<out>/<name>.md` (the markdown
docs/results.md shows), stamped with the commit and the date it ran on.

Every (table, row, seed) is one capacity search (bench/ruler/ruler.py `seed_capacity`),
all of them over one pool of `workers` processes, in table order and in each table seed
by seed (every row's seed 0, then seed 1, ...): each table is written
as soon as its own searches are done, so a run cut short still leaves its first tables,
and every search as soon as it is done (`<out>/searches.jsonl`), so that the same run
started again on the same commit goes on where it stopped.
A run with fewer seeds or requests than a table's protocol says so in its markdown.
`profile`: the tables on another profile (bench/studies/results_profile.py): every row and
study runs on it, its fixed rates scaled, and every table's stamp names it.
The tables that studies of their own make (overload, tenants, live vs simulated:
bench/studies/results_studies.py) run first, each a few minutes; `--seeds` and
`--measured` do not change them.
"""
from __future__ import annotations

import datetime
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from bench.json_file import write_json
from bench.parallel import imap_unordered
from bench.ruler.ceiling import workload_ceilings
from bench.ruler.ruler import NEAR_GROWTH, SeedCapacity, seed_capacity
from bench.sim.sim_flags import sim_settings
from bench.studies.results_profile import ProfileTarget
from bench.studies.results_studies import run_study
from bench.studies.results_tables import (
    QUICK, STUDIES, TABLES, Group, Protocol, Row, Table, capacity_parser,
)
from daemon.layout import layout_modes


class RowResult(msgspec.Struct, kw_only=True):
    label: str
    command: str                # the `ascendra capacity` command of this row, as run
    seeds: list[SeedCapacity]
    mean_qps: float
    min_qps: float
    max_qps: float
    fair_mean_qps: float
    fair_min_qps: float
    fair_max_qps: float


class GroupResult(msgspec.Struct, kw_only=True):
    name: str
    rows: list[RowResult]
    measured: int | None = None     # when not the table's
    #: the first row's mean capacity (fair capacity) over the best of the others'
    ratio: float | None = None
    fair_ratio: float | None = None


class TableResult(msgspec.Struct, kw_only=True):
    name: str
    title: str
    command: str                # the command that regenerates this table
    commit: str
    date: str
    protocol: Protocol          # as run
    full_protocol: Protocol     # as the table asks
    quick: bool
    groups: list[GroupResult]
    fair: bool = True           # fair capacity searched (else `--fair-floor 0`)


class ProfiledTableResult(TableResult, kw_only=True):
    """A table run on another profile than the one it was set for (`--profile`)."""
    target: ProfileTarget


def table_command(name: str, target: ProfileTarget | None = None) -> str:
    profile = f" --profile {target.profile}" if target else ""
    return f"ascendra reproduce results --table {name}{profile} --out DIR"


def row_command(row: Row, protocol: Protocol, measured: int | None = None,
                quick: bool = False, target: ProfileTarget | None = None) -> str:
    """The row's `ascendra capacity` command under `protocol` (`measured`: its group's own),
    its search started near the row's last capacity where it has one (not in a `quick`
    run, whose short points hold far higher); on `target`'s profile, that start scaled."""
    seeds = ",".join(str(s) for s in protocol.seeds)
    start = row.start and (target.rate(row.start) if target else row.start)
    start = (f" --start-qps {start:g} --start-growth {NEAR_GROWTH:g}"
             if start and not quick else "")
    flags = f"{row.flags} {target.flags()}" if target else row.flags
    return (f"ascendra capacity {flags} --measured {measured or protocol.measured} "
            f"--seeds {seeds} --tolerance {protocol.tolerance:g}{start}")


def search(job: tuple[str, int]) -> SeedCapacity:
    """One capacity search: a row's command, on one seed (a top-level function: pickles)."""
    command, seed = job
    args = capacity_parser().parse_args(command.split()[2:])
    subject, config = sim_settings(args)
    config = msgspec.structs.replace(config, seeds=(seed,), measured=args.measured,
                                     tolerance=args.tolerance, fair_floor=args.fair_floor)
    start = (args.start_qps or
             0.8 * workload_ceilings(config, len(layout_modes(subject.layout))).all_served_qps)
    return seed_capacity(subject, config, seed, start, args.start_growth)


def protocol_for(table: Table, quick: bool, seeds: Sequence[int] | None,
                 measured: int | None) -> Protocol:
    base = QUICK if quick else table.protocol
    return Protocol(measured=measured or base.measured,
                    seeds=tuple(seeds) if seeds else base.seeds,
                    tolerance=min(base.tolerance, table.protocol.tolerance) if not quick
                    else base.tolerance)


def run_tables(names: Sequence[str], out: str | Path, *, quick: bool = False,
               seeds: Sequence[int] | None = None, measured: int | None = None,
               workers: int | None = None,
               progress: Callable[[str], None] | None = None,
               target: ProfileTarget | None = None) -> list[Path]:
    """Run the named tables (the studies' first); the markdown files written, in order.
    `target`: on another profile (`results_profile.profile_target`)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = _commit(), utc_date()
    written = []
    if progress and target:
        progress(target.describe().replace("**", ""))
    for study in (STUDIES[n] for n in names if n in STUDIES):
        if progress:
            progress(f"{study.name}: {study.command(quick, str(out / study.name), target)}")
        written.append(run_study(study, out, quick, workers, stamp,
                                 table_command(study.name, target), target))
    tables = [TABLES[n] for n in names if n in TABLES]
    protocols = [protocol_for(t, quick, seeds, measured) for t in tables]
    # seed by seed: a run cut short has whole comparisons (every row) on its first seeds
    wanted = {t.name: [(row_command(row, p, _measured(g, measured, quick), quick, target), seed)
                       for seed in p.seeds for g in t.groups for row in g.rows]
              for t, p in zip(tables, protocols)}
    jobs = list(dict.fromkeys(job for table_jobs in wanted.values() for job in table_jobs))
    log = out / SEARCHES
    done = {job: result for job, result in read_searches(log, stamp[0]).items() if job in jobs}
    todo = [job for job in jobs if job not in done]
    if progress and done:
        progress(f"{len(done)} of {len(jobs)} searches already in {log} (commit {stamp[0]})")

    def write_finished() -> None:
        for table, protocol in zip(tables, protocols):
            if table.name in wanted and all(job in done for job in wanted[table.name]):
                del wanted[table.name]
                written.append(write(assemble(table, protocol, done, quick, *stamp,
                                              override=measured, target=target), out))

    write_finished()
    for i, result in imap_unordered(search, todo, workers):
        (cmd, seed) = todo[i]
        done[todo[i]] = result
        with open(log, "ab") as f:
            f.write(msgspec.json.encode(DoneSearch(cmd, seed, stamp[0], result)) + b"\n")
        if progress:
            progress(f"[{len(done)}/{len(jobs)}] {cmd} seed {seed}: capacity "
                     f"{result.capacity_qps:.2f}, fair {result.fair_capacity_qps:.2f}")
        write_finished()
    return written


#: Every finished search of a run, one `DoneSearch` a line, in `--out`: a run cut short
#: and started again on the same commit runs only the searches not there yet.
SEARCHES = "searches.jsonl"


class DoneSearch(msgspec.Struct, array_like=True):
    command: str
    seed: int
    commit: str
    result: SeedCapacity


def read_searches(path: Path, commit: str) -> dict[tuple[str, int], SeedCapacity]:
    """The searches `path` holds that ran on `commit` (none on a tree with uncommitted
    changes: its code is not known)."""
    if not path.exists() or commit.endswith("+dirty"):
        return {}
    lines = (msgspec.json.decode(line, type=DoneSearch)
             for line in path.read_bytes().splitlines() if line.strip())
    return {(d.command, d.seed): d.result for d in lines if d.commit == commit}


def _measured(group: Group, override: int | None, quick: bool) -> int | None:
    """A group's own measured count, unless the run sets one for every table."""
    return None if override or quick else group.measured


def assemble(table: Table, protocol: Protocol, searches: dict[tuple[str, int], SeedCapacity],
             quick: bool, commit: str, date: str, override: int | None = None,
             target: ProfileTarget | None = None) -> TableResult:
    groups = []
    for group in table.groups:
        rows = []
        for row in group.rows:
            cmd = row_command(row, protocol, _measured(group, override, quick), quick, target)
            rows.append(row_result(row.label, cmd, [searches[(cmd, s)] for s in protocol.seeds]))
        groups.append(with_ratios(group.name, rows, _measured(group, override, quick)))
    fields = dict(name=table.name, title=table.title, command=table_command(table.name, target),
                  commit=commit, date=date, protocol=protocol, full_protocol=table.protocol,
                  quick=quick, groups=groups, fair=table.fair)
    return ProfiledTableResult(**fields, target=target) if target else TableResult(**fields)


def row_result(label: str, command: str, seeds: list[SeedCapacity]) -> RowResult:
    caps = [s.capacity_qps for s in seeds]
    fair = [s.fair_capacity_qps for s in seeds]
    return RowResult(label=label, command=command, seeds=seeds,
                     mean_qps=round(sum(caps) / len(caps), 3), min_qps=min(caps),
                     max_qps=max(caps), fair_mean_qps=round(sum(fair) / len(fair), 3),
                     fair_min_qps=min(fair), fair_max_qps=max(fair))


def with_ratios(name: str, rows: list[RowResult], measured: int | None = None) -> GroupResult:
    first, others = rows[0], rows[1:]
    best = max((r.mean_qps for r in others), default=0.0)
    best_fair = max((r.fair_mean_qps for r in others), default=0.0)
    return GroupResult(name=name, rows=rows, measured=measured,
                       ratio=round(first.mean_qps / best, 3) if best else None,
                       fair_ratio=round(first.fair_mean_qps / best_fair, 3) if best_fair else None)


def write(doc: TableResult, out: Path) -> Path:
    write_json(out / f"{doc.name}.json", doc, indent=1)
    md = out / f"{doc.name}.md"
    md.write_text(render(doc))
    return md


def render(doc: TableResult) -> str:
    """The table as docs/results.md shows it: its stamp, its command, its protocol."""
    p = doc.protocol
    seeds = ",".join(str(s) for s in p.seeds)
    lines = [f"{doc.title}. Measured {doc.date} on commit {doc.commit}: `{doc.command}` "
             f"(rows: `ascendra capacity FLAGS --measured {p.measured} --seeds {seeds} "
             f"--tolerance {p.tolerance:g}`). Capacity / fair capacity, QPS, mean [min-max] "
             f"over seeds {seeds}.", ""]
    if isinstance(doc, ProfiledTableResult):
        lines += [doc.target.describe(), ""]
    if doc.quick:
        lines += ["**Quick run (`--quick`): a smoke test, not a measurement.**", ""]
    elif p != doc.full_protocol:
        full = doc.full_protocol
        lines += [f"**Reduced protocol**: {p.measured:,} measured, seeds {seeds} (the table's "
                  f"full protocol: {full.measured:,} measured, seeds "
                  f"{','.join(str(s) for s in full.seeds)}).", ""]
    if not doc.fair:
        lines += ["Fair capacity not searched (`--fair-floor 0`): a question of capacity "
                  "alone.", ""]
    lines += ["| group | row | capacity | fair capacity | first row / best other: capacity, "
              "fair |", "|---|---|---|---|---|"]
    for g in doc.groups:
        for i, r in enumerate(g.rows):
            ratio = (f"{g.ratio:.2f}x, {g.fair_ratio:.2f}x" if i == 0 and g.ratio else "")
            if not doc.fair:
                ratio = f"{g.ratio:.3f}x, -" if i == 0 and g.ratio else ""
            capacity = _spread(r.mean_qps, r.min_qps, r.max_qps)
            fair = (_spread(r.fair_mean_qps, r.fair_min_qps, r.fair_max_qps) if doc.fair
                    else "-")
            name = g.name + (f" ({g.measured:,})" if g.measured else "")
            lines.append(f"| {name if i == 0 else ''} | {r.label} | {capacity} | {fair} "
                         f"| {ratio} |")
    return "\n".join(lines) + "\n"


def _spread(mean: float, lo: float, hi: float) -> str:
    return f"{mean:.2f}" if lo == hi else f"{mean:.2f} [{lo:.2f}-{hi:.2f}]"


_HERE = Path(__file__).parent


def utc_date() -> str:
    """Now, as a table's stamp gives its date: "2026-11-29 03:15 UTC"."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _commit() -> str:
    """The tree's commit, `+dirty` when it has uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=_HERE).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True,
                               cwd=_HERE).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + ("+dirty" if dirty else "")
