"""Where a conversation's turns went, and which of them missed their targets.

On multi-turn traffic a turn finds its history cached only on the instance that served
the conversation's previous turn (its *home*). This study runs settings on the ruler's
multi-turn workload at one rate and sorts each measured turn, per prompt-length
quartile, by where it went relative to the turn before it:

* `first`         -- the conversation's first turn (nothing cached anywhere);
* `home`          -- the previous turn's instance, its history found there;
* `home, evicted` -- the previous turn's instance, part of its history evicted meanwhile;
* `moved`         -- another instance, which computed the history again;
* `dropped now`   -- shed by the server on arrival (the work queued ahead of it and its
                     own prefill already overran its deadline);
* `dropped, queue` -- shed after waiting in the controller's queue;
* `dropped, back` -- shed after an instance held it and handed it back (an LP that
                     predicts it would start a prompt too late lets go of it);
* `after a miss`  -- its previous turn was never served (dropped), so no home.

Each cell is good / turns (good: met both targets, as goodput counts). It says whether a
class loses because its turns leave home (recomputing their history) or because they are
refused, which is what docs/results.md's multi-turn section needed to know.

    python -m bench.studies.turn_homes --settings "3A,3xvllm-v1@2048+drops" --qps 47.91
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import msgspec

from bench.json_file import write_json
from bench.loadgen.reuse_workloads import conversation_of
from bench.loadgen.workload import WorkloadRequest
from bench.loadgen.workloads import workload
from bench.parallel import add_workers_flag, run_parallel
from bench.records.schema import RequestRecord
from bench.records.results import is_good
from bench.ruler.capacity_table import parse_setting
from bench.ruler.ruler import RulerConfig, Subject, ruler_classes, sim_config, workload_requests
from bench.sim.simulator import Simulation

PLACES = ("first", "home", "home, evicted", "moved", "dropped now", "dropped, queue",
          "dropped, back", "after a miss")


class ClassTurns(msgspec.Struct, kw_only=True):
    """One prompt-length class: its measured turns by place, [good, turns] each."""
    name: str
    turns: int
    good: int
    by_place: dict[str, list[int]]


class SettingTurns(msgspec.Struct, kw_only=True):
    """One setting, its seeds summed."""
    setting: str
    qps: float
    seeds: tuple[int, ...]
    classes: list[ClassTurns]


def place(record: RequestRecord, previous: tuple[int | None, int] | None,
          block_size: int) -> str:
    """Where a turn went relative to its conversation's previous turn, `previous` =
    (the instance that served it, or None; its prompt length), None for a first turn."""
    if record.outcome == "dropped":
        if record.instances:
            return "dropped, back"
        return "dropped now" if record.end_time == record.arrival else "dropped, queue"
    if previous is None:
        return "first"
    home, history = previous
    if home is None:
        return "after a miss"
    if record.instance != home:
        return "moved"
    whole_blocks = history // block_size * block_size
    return "home" if record.cached_tokens + block_size >= whole_blocks else "home, evicted"


def turn_places(requests: Sequence[WorkloadRequest], records: Sequence[RequestRecord],
                measured: set[int], block_size: int) -> dict[int, str]:
    """The place of every measured turn (by request index), walking the turns in
    arrival order, warm-up turns included (they set their conversation's home)."""
    by_index = {r.index: r for r in records}
    previous: dict[int, tuple[int | None, int]] = {}
    places = {}
    for request in sorted(requests, key=lambda w: (w.arrival, w.index)):
        conversation = conversation_of(request)
        record = by_index[request.index]
        before = previous.get(conversation) if conversation is not None else None
        if request.index in measured:
            places[request.index] = place(record, before, block_size)
        if conversation is not None:
            served = record.first_token_time is not None
            previous[conversation] = (record.instance if served else None, request.prompt_len)
    return places


def _run(job: tuple[Subject, RulerConfig, float, int]) -> list[ClassTurns]:
    subject, config, qps, seed = job
    requests = workload_requests(config, qps, seed)
    sim = sim_config(subject, config)
    records = Simulation(sim, requests).run()
    measured = config.rule.measured(records)
    places = turn_places(requests, records, {r.index for r in measured},
                         sim.block_size)
    classes = ruler_classes(config)
    labels = classes.prompt_labels()
    out = [ClassTurns(name=label, turns=0, good=0, by_place={p: [0, 0] for p in PLACES})
           for label in labels]
    for record in measured:
        row = out[classes.prompt_class(record.prompt_len)]
        good = is_good(record, config.slo.ttft_slo, config.slo.tbt_slo)
        row.turns += 1
        row.good += good
        cell = row.by_place[places[record.index]]
        cell[0] += good
        cell[1] += 1
    return out


def turn_homes(subjects: Sequence[Subject], qps: float, seeds: Sequence[int], measured: int,
               workers: int | None = None) -> list[SettingTurns]:
    """Each subject (`parse_setting`) on the ruler's multi-turn workload at `qps`, its
    seeds summed."""
    config = RulerConfig(workload=workload("multi-turn"), measured=measured,
                         seeds=tuple(seeds))
    jobs = [(subject, config, qps, seed) for subject in subjects for seed in seeds]
    runs = run_parallel(_run, jobs, workers)
    out = []
    for k, subject in enumerate(subjects):
        mine = runs[k * len(seeds):(k + 1) * len(seeds)]
        out.append(SettingTurns(setting=subject.label, qps=qps, seeds=tuple(seeds),
                                classes=[_summed(rows) for rows in zip(*mine)]))
    return out


def _summed(rows: Sequence[ClassTurns]) -> ClassTurns:
    return ClassTurns(name=rows[0].name, turns=sum(r.turns for r in rows),
                      good=sum(r.good for r in rows),
                      by_place={p: [sum(r.by_place[p][0] for r in rows),
                                    sum(r.by_place[p][1] for r in rows)] for p in PLACES})


def print_table(result: Sequence[SettingTurns]) -> None:
    header = ["class", "goodput"] + list(PLACES)
    for setting in result:
        print(f"\n{setting.setting} at {setting.qps:g} QPS, seeds "
              f"{','.join(map(str, setting.seeds))}: good / turns")
        print(" | ".join(header))
        for row in setting.classes:
            cells = [f"{good}/{n}" if n else "-" for good, n in row.by_place.values()]
            pct = 100.0 * row.good / row.turns if row.turns else 0.0
            print(" | ".join([row.name, f"{pct:.1f} %"] + cells))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.turn_homes",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", required=True,
                        help="comma-separated: layouts, and baselines as "
                             "layout@chunk[+drops][/ROUTING]")
    parser.add_argument("--qps", type=float, required=True, help="the rate of every run")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--measured", type=int, default=1500,
                        help="measured turns a run (default 1500, the multi-turn ruler's)")
    parser.add_argument("--json", type=Path, help="write the table here")
    add_workers_flag(parser)
    args = parser.parse_args(argv)
    try:
        subjects = [parse_setting(s) for s in args.settings.split(",")]
    except ValueError as error:
        parser.error(f"--settings: {error}")
    result = turn_homes(subjects, args.qps, [int(s) for s in args.seeds.split(",")],
                        args.measured, args.workers)
    print_table(result)
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
