"""The tables of docs/results.md, each as the `ascendra capacity` runs that regenerate it.

A table is a list of groups (a workload, or a question's one setting), each a list of rows;
a row is one `ascendra capacity` command line (its flags, without `--measured`, `--seeds`
or `--tolerance`: the table's protocol sets those). The first row of a group is the one
the group is about (Ascendra's `3A`); the table's ratios are its capacity and fair
capacity over the best of the group's other rows.

`ascendra reproduce results --table NAME` runs one table, `ascendra reproduce results`
all of them (bench/studies/results_run.py); docs/results.md shows what they wrote and
tests/test_results_page.py checks that every table there names such a command.

The baselines' rows are each one's best setting found by the sweep of
bench/ruler/capacity_table.py (docs/results_history.md, "Capacity with the faithful
baselines"): every baseline with drops (`--drop-expired`), vLLM V0 at its 8,192-token
budget, SGLang at 4,096, vLLM V1 at 2,048, and round-robin routing where that routing
was the baseline's better one.
"""
from __future__ import annotations

import argparse

import msgspec

from bench.ruler.ruler import RulerConfig
from bench.sim.sim_flags import add_fair_floor_flag, add_sim_flags, add_start_growth_flag


class Row(msgspec.Struct, frozen=True):
    label: str
    flags: str          # `ascendra capacity` flags, e.g. "--layout 3A --workload poisson"
    #: Where the search starts, stepping 5 % at a time (`--start-qps`, `--start-growth`):
    #: the row's last measured capacity (docs/results.md), so that it brackets the edge in
    #: two or three runs instead of five or six from the hardware ceiling. A stale start
    #: costs runs, not accuracy: the search walks on until it brackets the edge.
    start: float | None = None


class Group(msgspec.Struct, frozen=True):
    name: str
    rows: tuple[Row, ...]
    #: measured requests a point for this group, when not the table's (multi-turn's 1,500)
    measured: int | None = None


class Protocol(msgspec.Struct, frozen=True):
    """How many requests and seeds each row's capacity is searched with."""
    measured: int = 4500
    seeds: tuple[int, ...] = (0, 1, 2)
    tolerance: float = 0.03


class Table(msgspec.Struct, frozen=True):
    name: str
    question: str       # the section of docs/results.md that shows it
    title: str
    groups: tuple[Group, ...]
    protocol: Protocol = Protocol()
    #: False: a question of capacity alone, its rows run with `--fair-floor 0` (a fair
    #: search at a fine step costs more runs than the capacity's).
    fair: bool = True


#: A `--quick` run: a smoke test of every table, not a measurement.
QUICK = Protocol(measured=150, seeds=(0,), tolerance=0.25)

ASCENDRA = "--layout 3A"
VLLM_V0 = "--layout 3xvllm-v0 --chunk-size 8192 --drop-expired"
VLLM_V1 = "--layout 3xvllm-v1 --chunk-size 2048 --drop-expired"
SGLANG = "--layout 3xsglang --chunk-size 4096 --drop-expired"
ROUND_ROBIN = " --routing round_robin"


def _versus(workload: str, *baselines: tuple[str, str, float]) -> Group:
    """`3A` against the named baselines (label, flags, last capacity) on one workload."""
    name = workload.replace("--workload ", "").replace("--trace ", "")
    rows = [Row("3A", f"{ASCENDRA} {workload}", ASCENDRA_LAST[name, 4500])]
    rows += [Row(label, f"{flags} {workload}", last) for label, flags, last in baselines]
    return Group(name, tuple(rows))


#: `3A`'s last measured capacity per (workload, measured requests), QPS (docs/results.md,
#: 2026-11-25..28; bursty-cv2's and onoff's at 4,500 were not measured: their 1,125's).
ASCENDRA_LAST = {("poisson", 4500): 11.34, ("poisson", 1125): 11.78,
                 ("bursty-cv2", 4500): 10.85, ("bursty-cv2", 1125): 10.85,
                 ("onoff", 4500): 5.66, ("onoff", 1125): 5.66,
                 ("mixed-slo", 4500): 10.05, ("mixed-slo", 1125): 10.75,
                 ("bursty-cv4", 4500): 5.21, ("bursty-cv4", 1125): 3.87,
                 ("shifting", 4500): 8.50, ("multi-turn", 1500): 54.57,
                 ("azure-conv", 4500): 27.23}
#: ... and with `--class-floor 0.8` (docs/fairness.md; bursty-cv2's and onoff's at 1,125).
FLOOR_LAST = {"poisson": 10.73, "bursty-cv4": 4.82, "shifting": 7.14, "mixed-slo": 10.01,
              "multi-turn": 50.23, "bursty-cv2": 8.84, "onoff": 5.07}
#: 2L1H's at 1,125 measured; the static splits' on shifting at 4,500 (3L0H's at 2,250).
SPLIT_LAST = {"poisson": 10.95, "bursty-cv2": 10.44, "onoff": 5.45, "mixed-slo": 10.44,
              "bursty-cv4": 3.88}
SHIFTING_LAST = {"3A": 8.50, "2L1H": 8.46, "1L2H": 8.44, "3L0H": 7.37}


def _fair_group(workload: str, measured: int | None) -> Group:
    own = ASCENDRA_LAST[workload, measured or 4500]
    return Group(workload, (
        Row("3A", f"{ASCENDRA} --workload {workload}", own),
        Row("3A --class-floor 0.8", f"{ASCENDRA} --workload {workload} --class-floor 0.8",
            FLOOR_LAST[workload])), measured)


TABLES: dict[str, Table] = {t.name: t for t in (
    Table("capacity", "Capacity", "3A against each workload's best baseline", (
        _versus("--workload poisson", ("vLLM V0 @8192 + drops", VLLM_V0, 9.07)),
        _versus("--workload bursty-cv2",
                ("vLLM V0 @8192 + drops, round-robin", VLLM_V0 + ROUND_ROBIN, 6.88)),
        _versus("--workload onoff",
                ("vLLM V0 @8192 + drops, round-robin", VLLM_V0 + ROUND_ROBIN, 4.00)),
        _versus("--workload mixed-slo", ("vLLM V0 @8192 + drops", VLLM_V0, 8.58),
                ("vLLM V0 @8192 + drops, round-robin", VLLM_V0 + ROUND_ROBIN, 8.58)),
    )),
    Table("bursts", "Bursts and shifting traffic", "3A against the best baseline on bursty "
          "and shifting traffic", (
              _versus("--workload bursty-cv4",
                      ("SGLang @4096 + drops, round-robin", SGLANG + ROUND_ROBIN, 2.35)),
              _versus("--workload shifting",
                      ("vLLM V0 @8192 + drops, round-robin", VLLM_V0 + ROUND_ROBIN, 5.24)),
          )),
    Table("roles", "Roles", "Roles chosen online (3A) against every static split of three "
          "instances, shifting traffic, a fine search step, capacity alone", (
              Group("shifting", tuple(
                  Row(layout, f"--layout {layout} --workload shifting --fair-floor 0", last)
                  for layout, last in SHIFTING_LAST.items())),
          ), Protocol(tolerance=0.01), fair=False),
    Table("fair", "Fair capacity and who pays", "3A by default and with a class floor "
          "(--class-floor 0.8)", tuple(
              _fair_group(w, measured)
              for w, measured in (("poisson", None), ("bursty-cv4", None), ("shifting", None),
                                  ("mixed-slo", None), ("multi-turn", 1500),
                                  ("bursty-cv2", 1125), ("onoff", 1125)))),
    Table("splits", "Roles", "Roles chosen online (3A) against the paper's fixed split (2L1H)",
          tuple(Group(w, (Row("3A", f"{ASCENDRA} --workload {w}", ASCENDRA_LAST[w, 1125]),
                          Row("2L1H", f"--layout 2L1H --workload {w}", SPLIT_LAST[w])))
                for w in ("poisson", "bursty-cv2", "onoff", "mixed-slo", "bursty-cv4")),
          Protocol(measured=1125)),
    Table("prefix", "Prefix caching", "Multi-turn conversations (5 turns, each prompt the "
          "history so far), prefix caching on everywhere", (
              Group("multi-turn", (
                  Row("3A", f"{ASCENDRA} --workload multi-turn",
                      ASCENDRA_LAST["multi-turn", 1500]),
                  Row("vLLM V1 @2048 + drops", f"{VLLM_V1} --workload multi-turn", 47.91))),
          ), Protocol(measured=1500)),
    Table("replay", "The replayed trace", "The Azure LLM inference trace (conversation), "
          "its own arrival times rescaled", (
              _versus("--trace azure-conv", ("vLLM V1 @2048 + drops", VLLM_V1, 20.81)),
          )),
)}

class StudyTable(msgspec.Struct, frozen=True):
    """A table of docs/results.md that a study of its own makes (not capacity searches):
    `python -m MODULE FLAGS`, told by `out_flags` to write under the table's folder
    (`{dir}`), its results in `data_file` there; `--quick` runs it with `quick_flags`
    instead of `flags`."""
    name: str
    question: str
    title: str
    module: str
    flags: str
    quick_flags: str
    out_flags: str
    data_file: str
    takes_workers: bool = True      # the study has `--workers`
    #: the study's own `--capacity` default when its flags name none (a run on another
    #: profile scales it: bench/studies/results_profile.py)
    default_capacity: float | None = None

    def command(self, quick: bool = False, out: str = "DIR", target=None) -> str:
        """The study's own command line, as the run calls it (`out`: the table's folder;
        `target`: another profile's `ProfileTarget`, its rates and flags)."""
        flags = self.quick_flags if quick else self.flags
        if target is not None:
            flags = target.study_flags(flags, self.default_capacity)
        return " ".join(w for w in ("python -m", self.module, flags,
                                    self.out_flags.format(dir=out)) if w)


#: The tables made by studies of their own; `ascendra reproduce results` runs these first
#: (minutes each, where a capacity table takes hours).
STUDIES: dict[str, StudyTable] = {s.name: s for s in (
    StudyTable("overload", "Overload", "Poisson at multiples of the best baseline's capacity "
               "(9.47 QPS), five simulated minutes, seed 0, every layout with a drop rule",
               "bench.studies.overload", "--capacity 9.47 --loads 1,1.5,2,3 --minutes 5",
               "--capacity 9.47 --loads 1,3 --minutes 0.5", "--json {dir}/overload_curve.json",
               "overload_curve.json"),
    StudyTable("tenants", "Tenants", "Tenants sharing one box: a flood from one tenant, "
               "sheddable traffic (tenants.md)", "bench.studies.tenants", "", "--quick",
               "--out {dir}/tenants.json --figures {dir}", "tenants.json",
               default_capacity=11.3),  # bench/studies/tenants.py DEFAULT_CAPACITY
    StudyTable("live", "Live vs simulated", "The real daemon (`ascendra serve --executor sim`) "
               "under `ascendra bench` against `ascendra simulate` on the same requests, 2L1H",
               "bench.studies.live_check",
               "--points poisson:10.4,bursty-cv4:4.7,mixed-slo:9.3 --num-requests 1500",
               "--points poisson:10.4 --num-requests 150", "--out {dir}", "summary.json",
               takes_workers=False),
)}


def capacity_parser() -> argparse.ArgumentParser:
    """The flags of a row: `ascendra capacity`'s settings and search protocol, from the same
    flag builders, so a row means what it means there (tests/test_results_page.py parses
    each with `ascendra capacity` itself)."""
    parser = argparse.ArgumentParser(prog="ascendra capacity")
    add_sim_flags(parser)
    add_fair_floor_flag(parser)
    parser.add_argument("--measured", type=int, default=RulerConfig().measured)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--tolerance", type=float, default=RulerConfig().tolerance)
    parser.add_argument("--start-qps", type=float, default=None)
    add_start_growth_flag(parser)
    return parser
