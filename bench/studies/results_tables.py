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

import msgspec


class Row(msgspec.Struct, frozen=True):
    label: str
    flags: str          # `ascendra capacity` flags, e.g. "--layout 3A --workload poisson"


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


#: A `--quick` run: a smoke test of every table, not a measurement.
QUICK = Protocol(measured=150, seeds=(0,), tolerance=0.25)

ASCENDRA = "--layout 3A"
VLLM_V0 = "--layout 3xvllm-v0 --chunk-size 8192 --drop-expired"
VLLM_V1 = "--layout 3xvllm-v1 --chunk-size 2048 --drop-expired"
SGLANG = "--layout 3xsglang --chunk-size 4096 --drop-expired"
ROUND_ROBIN = " --routing round_robin"


def _versus(workload: str, *baselines: tuple[str, str]) -> Group:
    """`3A` against the named baselines on one workload's flags."""
    rows = [Row("3A", f"{ASCENDRA} {workload}")]
    rows += [Row(label, f"{flags} {workload}") for label, flags in baselines]
    return Group(workload.replace("--workload ", "").replace("--trace ", ""), tuple(rows))


TABLES: dict[str, Table] = {t.name: t for t in (
    Table("capacity", "Capacity", "3A against each workload's best baseline", (
        _versus("--workload poisson", ("vLLM V0 @8192 + drops", VLLM_V0)),
        _versus("--workload bursty-cv2",
                ("vLLM V0 @8192 + drops, round-robin", VLLM_V0 + ROUND_ROBIN)),
        _versus("--workload onoff",
                ("vLLM V0 @8192 + drops, round-robin", VLLM_V0 + ROUND_ROBIN)),
        _versus("--workload mixed-slo", ("vLLM V0 @8192 + drops", VLLM_V0),
                ("vLLM V0 @8192 + drops, round-robin", VLLM_V0 + ROUND_ROBIN)),
    )),
    Table("bursts", "Bursts and shifting traffic", "3A against the best baseline on bursty "
          "and shifting traffic", (
              _versus("--workload bursty-cv4",
                      ("SGLang @4096 + drops, round-robin", SGLANG + ROUND_ROBIN)),
              _versus("--workload shifting",
                      ("vLLM V0 @8192 + drops, round-robin", VLLM_V0 + ROUND_ROBIN)),
          )),
    Table("roles", "Roles", "Roles chosen online (3A) against every static split of three "
          "instances, shifting traffic, a fine search step", (
              Group("shifting", tuple(Row(layout, f"--layout {layout} --workload shifting")
                                      for layout in ("3A", "2L1H", "1L2H", "3L0H"))),
          ), Protocol(tolerance=0.01)),
    Table("fair", "Fair capacity and who pays", "3A by default and with a class floor "
          "(--class-floor 0.8)", tuple(
              Group(w, (Row("3A", f"{ASCENDRA} --workload {w}"),
                        Row("3A --class-floor 0.8",
                            f"{ASCENDRA} --workload {w} --class-floor 0.8")), measured)
              for w, measured in (("poisson", None), ("bursty-cv4", None), ("shifting", None),
                                  ("mixed-slo", None), ("multi-turn", 1500),
                                  ("bursty-cv2", 1125), ("onoff", 1125)))),
    Table("splits", "Roles", "Roles chosen online (3A) against the paper's fixed split (2L1H)",
          tuple(Group(w, (Row("3A", f"{ASCENDRA} --workload {w}"),
                          Row("2L1H", f"--layout 2L1H --workload {w}")))
                for w in ("poisson", "bursty-cv2", "onoff", "mixed-slo", "bursty-cv4")),
          Protocol(measured=1125)),
    Table("prefix", "Prefix caching", "Multi-turn conversations (5 turns, each prompt the "
          "history so far), prefix caching on everywhere", (
              _versus("--workload multi-turn", ("vLLM V1 @2048 + drops", VLLM_V1)),
          ), Protocol(measured=1500)),
    Table("replay", "The replayed trace", "The Azure LLM inference trace (conversation), "
          "its own arrival times rescaled", (
              _versus("--trace azure-conv", ("vLLM V1 @2048 + drops", VLLM_V1)),
          )),
)}
