"""The turn-homes study (bench/studies/turn_homes.py): each measured turn is placed
relative to its conversation's previous turn, and a run's cells add up to its classes.

Covers: bench/studies/turn_homes.py.
"""
from __future__ import annotations

import pytest

from bench.loadgen.reuse_workloads import HISTORY, conversation_of
from bench.loadgen.workload import PromptPart, WorkloadRequest
from bench.records.schema import RequestRecord
from bench.ruler.capacity_table import parse_setting
from bench.studies.turn_homes import PLACES, main, turn_homes, turn_places

BLOCK = 16


def _turn(index: int, arrival: float, conversation: int, turn: int, piece: int = 100,
          warmup: bool = False) -> WorkloadRequest:
    parts = tuple(PromptPart((HISTORY, conversation, k), piece) for k in range(turn))
    return WorkloadRequest(index, arrival, piece * turn, 10, prompt_parts=parts,
                           warmup=warmup)


def _served(index: int, arrival: float, instance: int, cached: int = 0) -> RequestRecord:
    return RequestRecord(index=index, arrival=arrival, prompt_len=0, output_len=10,
                         outcome="completed", first_token_time=arrival + 0.1,
                         instance=instance, instances=[instance], cached_tokens=cached)


def _dropped(index: int, arrival: float, end: float, instances=()) -> RequestRecord:
    return RequestRecord(index=index, arrival=arrival, prompt_len=0, output_len=10,
                         outcome="dropped", end_time=end, instances=list(instances))


def test_a_turn_is_placed_by_where_its_conversations_previous_turn_was_served():
    requests = [_turn(0, -5.0, 7, 1, warmup=True),       # primes conversation 7 on instance 1
                _turn(1, 1.0, 7, 2),                      # home, history found
                _turn(2, 2.0, 7, 3),                      # home, part of it evicted
                _turn(3, 3.0, 7, 4),                      # moved to instance 0
                _turn(4, 4.0, 8, 1),                      # a first turn
                _turn(5, 5.0, 8, 2),                      # dropped on arrival
                _turn(6, 6.0, 8, 3),                      # after a miss
                _turn(7, 7.0, 9, 1),                      # dropped after waiting in the queue
                _turn(8, 8.0, 9, 2)]                      # dropped after an instance held it
    records = [_served(0, -5.0, 1),
               _served(1, 1.0, 1, cached=96),             # 100 tokens: 6 whole blocks
               _served(2, 2.0, 1, cached=32),             # 200 tokens: far short of 12 blocks
               _served(3, 3.0, 0),
               _served(4, 4.0, 2),
               _dropped(5, 5.0, 5.0),
               _served(6, 6.0, 2),
               _dropped(7, 7.0, 7.4),
               _dropped(8, 8.0, 8.6, instances=[1])]
    places = turn_places(requests, records, measured=set(range(1, 9)), block_size=BLOCK)
    assert places == {1: "home", 2: "home, evicted", 3: "moved", 4: "first",
                      5: "dropped now", 6: "after a miss", 7: "dropped, queue",
                      8: "dropped, back"}


def test_only_a_multi_turn_request_belongs_to_a_conversation():
    assert conversation_of(_turn(0, 0.0, 42, 2)) == 42
    assert conversation_of(WorkloadRequest(0, 0.0, 10, 10)) is None
    system = WorkloadRequest(0, 0.0, 10, 10, prompt_parts=(PromptPart((1, 0), 10),))
    assert conversation_of(system) is None


@pytest.mark.slow
def test_a_run_places_every_measured_turn_of_every_class():
    (result,) = turn_homes([parse_setting("3L0H")], qps=20.0, seeds=[0], measured=200,
                           workers=1)
    assert sum(row.turns for row in result.classes) == 200
    for row in result.classes:
        assert set(row.by_place) == set(PLACES)
        assert sum(n for _, n in row.by_place.values()) == row.turns
        assert sum(good for good, _ in row.by_place.values()) == row.good
    # five turns a conversation: most measured turns have a home to go back to
    placed = {p: sum(row.by_place[p][1] for row in result.classes) for p in PLACES}
    assert placed["home"] > placed["first"]


@pytest.mark.parametrize("setting, named", [("3xvllm-v1@big", "the chunk a number"),
                                             ("bogus", "cannot read 'bogus'")])
def test_a_malformed_setting_is_refused_naming_the_flag(capsys, setting, named):
    with pytest.raises(SystemExit) as exit_info:
        main(["--settings", setting, "--qps", "10"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--settings" in err and named in err
