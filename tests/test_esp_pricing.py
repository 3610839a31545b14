"""What an ESP prefill is predicted to cost (engines/executors/profiles/esp_time.py: the
stripe's compute on the GPU profile, the per-layer all-gather priced from the NCCL
all-reduce table), over how many instances one is split and over which
(policies/esp_degree.py).

Covers: engines/executors/profiles/esp_time.py, policies/esp_degree.py.
"""
from __future__ import annotations

import pytest

from engines.executors.profiles.all_reduce import load_all_reduce
from engines.executors.profiles.esp_time import all_gather_seconds, esp_prefill_time
from engines.executors.profiles.registry import get_profile
from policies.esp_degree import EspCandidate, esp_degree, esp_members

PROFILE = "a100-llama3-8b"


@pytest.fixture(scope="module")
def profile():
    return get_profile(PROFILE)


def test_an_all_gather_is_half_a_measured_all_reduce_and_three_gpus_read_four(profile):
    table = load_all_reduce(profile.network_file)
    size = 64 * 2**20
    assert all_gather_seconds(table, 2, size) == pytest.approx(table.seconds(2, size) / 2)
    assert all_gather_seconds(table, 4, size) == pytest.approx(table.seconds(4, size) / 2)
    # k = 3 moves 2/3 of the bytes through each link where w = 4's all-reduce moved 3/2
    assert all_gather_seconds(table, 3, size) == pytest.approx(table.seconds(4, size) * 4 / 9)
    assert all_gather_seconds(table, 1, size) == 0.0
    with pytest.raises(ValueError, match="no all-reduce times for 9 GPUs"):
        all_gather_seconds(table, 9, size)


def test_a_100k_prompt_over_three_a100s_is_about_three_times_faster_than_on_one(profile):
    one = esp_prefill_time(profile, 100_000, 1)
    three = esp_prefill_time(profile, 100_000, 3)
    assert one.exchange == 0.0
    assert 2.7 < one.total / three.total < 3.9
    # the KV exchange over NVLink is small next to the stripe's compute
    assert 0 < three.exchange < 0.02 * three.compute


def test_the_degree_is_the_smallest_that_meets_the_deadline(profile):
    def predict(n):
        return lambda k: esp_prefill_time(profile, n, k).total

    assert esp_degree(16_384, 15.0, predict(16_384), free=3, max_degree=3) == 1
    assert esp_degree(100_000, 15.0, predict(100_000), free=3, max_degree=3) == 2
    assert esp_degree(100_000, 9.0, predict(100_000), free=3, max_degree=3) == 3


def test_no_group_when_off_or_alone_all_free_when_late_and_an_operators_length_forces_one():
    def predict(k):
        return 30.0 / k

    assert esp_degree(100_000, 15.0, predict, free=3, max_degree=1) == 1   # ESP off
    assert esp_degree(100_000, 15.0, predict, free=1, max_degree=3) == 1   # nothing free
    assert esp_degree(100_000, 5.0, predict, free=3, max_degree=4) == 3    # late: all free
    assert esp_degree(2_000, 40.0, predict, free=3, max_degree=3, min_tokens=1_000) == 2
    assert esp_degree(900, 40.0, predict, free=3, max_degree=3, min_tokens=1_000) == 1


def test_a_group_takes_members_it_stalls_least_and_never_a_decoding_master_first():
    idle_master = EspCandidate(0, masters=1, wait=0.0, running=1)   # decodes a long request
    queued = EspCandidate(1, masters=0, wait=4.0, running=3)        # 4 s of prefill queued
    idle = EspCandidate(2, masters=0, wait=0.0, running=5)
    busy_in_group = EspCandidate(3, masters=0, wait=9.0, running=0)  # a pending group's step
    assert esp_members([idle_master, queued, idle, busy_in_group]) == [2, 1, 3, 0]
    # equal waits: the fewest running requests, then the lower id
    assert esp_members([EspCandidate(5, 0, 0.0, 2), EspCandidate(4, 0, 0.0, 2),
                        EspCandidate(6, 0, 0.0, 1)]) == [6, 4, 5]
