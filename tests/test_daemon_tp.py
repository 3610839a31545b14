"""`serve --tp 2` end to end on CPU (gloo), the tiny torch model: every instance is two
processes; greedy answers equal `--tp 1`'s on the parity set; /health and /metrics say each
instance's degree and rank pids; and kill -9 of a rank 1 under load ends its instance,
whose requests finish on the others, none lost.

Covers: engines/tp_ranks.py, engines/tp_rank_main.py, daemon/serve_cmd.py.
"""
from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.daemon_fixture import torch_args, wait_for
from tests.test_daemon_faults import client_for, metric, model_of
from tests.test_engine_parity import TEXTS

pytestmark = pytest.mark.slow  # daemons with two-rank torch instances

MAX_TOKENS = 24


def greedy(daemon) -> list[str]:
    client, model = client_for(daemon), model_of(daemon)

    def one(prompt: str) -> str:
        answer = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS,
                                           temperature=0, extra_body={"ignore_eos": True})
        return answer.choices[0].text

    with ThreadPoolExecutor(len(TEXTS)) as pool:
        return list(pool.map(one, TEXTS))


def test_tp2_greedy_answers_equal_tp1_and_health_shows_the_ranks(daemon_factory):
    expected = greedy(daemon_factory(*torch_args()))
    daemon = daemon_factory(*torch_args(), "--tp", "2")
    assert greedy(daemon) == expected
    (instance,) = daemon.health()["instances"]
    assert instance["tp"] == 2 and len(instance["rank_pids"]) == 1
    assert metric(daemon, 'ascendra_instance_tp{devices="",instance="0"}') == 2


def test_a_killed_rank_ends_its_instance_and_its_requests_finish_elsewhere(daemon_factory):
    daemon = daemon_factory(*torch_args(), "--layout", "2xsarathi", "--tp", "2",
                            "--heartbeat-interval", "0.1")
    client, model = client_for(daemon), model_of(daemon)

    def one(i: int):
        return client.completions.create(model=model, prompt=TEXTS[i % len(TEXTS)],
                                         max_tokens=48, temperature=0,
                                         extra_body={"ignore_eos": True})

    with ThreadPoolExecutor(6) as pool:
        answers = [pool.submit(one, i) for i in range(6)]
        victim = wait_for(lambda: next((i for i in daemon.health()["instances"]
                                        if i["in_flight"] and i["rank_pids"]), None),
                          30, what="an instance holding requests")
        os.kill(victim["rank_pids"][0], signal.SIGKILL)
        results = [a.result(timeout=120) for a in answers]
    assert all(r.usage.completion_tokens == 48 for r in results)
    assert metric(daemon, 'ascendra_requests_total{outcome="completed"}') == 6
    health = wait_for(lambda: (h := daemon.health())["status"] == "ok" and h, 60,
                      what="the instance back with both ranks")
    back = health["instances"][victim["id"]]
    assert back["restarts"] == 1 and back["rank_pids"] != victim["rank_pids"]
