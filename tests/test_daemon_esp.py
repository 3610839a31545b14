"""ESP groups live (LoongServe's elastic sequence parallelism): a daemon of three CPU torch
instances prefills a long prompt striped over all three (the operator's length threshold
plans the group), gathers its KV to the master once, and the master decodes it -- while
short requests are served beside it. Every request is answered once, the group is formed
and dissolved with its reasons (log and /metrics), and the long prompt's greedy text is
one instance's.

Covers: engines/instance.py, engines/executors/torch_executor.py, engines/esp_parts.py.
"""
from __future__ import annotations

import json
import os
import re
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engines.models import tiny_tokenizer
from tests.daemon_fixture import torch_args, wait_for

pytestmark = pytest.mark.slow  # two daemons with torch instances

LONG_TOKENS = 1_600
#: A long prompt of token ids (deterministic, spread over the tiny vocabulary).
LONG = [5 + (i * 7919) % (tiny_tokenizer.VOCAB_SIZE - 10) for i in range(LONG_TOKENS)]
SHORT = ["The library was quiet except for", "Once upon a time", "a" * 150,
         "Numbers: 1 2 3 4 5 6 7 8 9 10"]


def complete(daemon, prompt) -> str:
    """The greedy text; a failed group's step may take ESP_TIMEOUT_S before the recompute."""
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    if prompt is LONG:  # a first token wanted at once: no group is fast enough, so the
        body["ttft_slo"] = 0.001  # long prompt takes every free instance (degree 3)
    status, _, raw = daemon.request("POST", "/v1/completions", body, timeout=120)
    assert status == 200, raw
    [choice] = json.loads(raw)["choices"]
    return choice["text"]


def serve_all(daemon) -> list[str]:
    """The long prompt among the short ones, all at once."""
    with ThreadPoolExecutor(max_workers=len(SHORT) + 1) as pool:
        return list(pool.map(lambda p: complete(daemon, p), [SHORT[0], LONG, *SHORT[1:]]))


def esp_counts(daemon) -> dict[tuple[str, str], float]:
    """ascendra_esp_groups_total by (event, degree), as Prometheus parses /metrics."""
    _, _, metrics = daemon.request("GET", "/metrics")
    return {(s.labels["event"], s.labels["degree"]): s.value
            for family in text_string_to_metric_families(metrics.decode())
            for s in family.samples if s.name == "ascendra_esp_groups_total"}


def test_a_long_prompt_prefilled_by_an_esp_group_decodes_as_one_instance(daemon_factory):
    single = daemon_factory(*torch_args(), "--layout", "1xsarathi")
    expected = serve_all(single)
    # a step's token budget of 256: the group's prefill runs in 3 chunks of up to 768
    esp = daemon_factory(*torch_args(), "--layout", "3xsarathi", "--esp-max-degree", "3",
                         "--esp-min-tokens", "1000", "--chunk-size", "256",
                         "--max-wait-slo-multiple", "1000000")
    assert serve_all(esp) == expected
    log = esp.log()
    [formed] = re.findall(r"over instances \[(.*)\] formed: 1600 prompt tokens >= "
                          r"min_tokens 1000", log)
    assert sorted(formed.split(", ")) == ["0", "1", "2"]
    assert log.count("over instances [") == 2, log          # formed once, dissolved once
    assert f"over instances [{formed}] dissolved: the request ended" in log
    assert log.count("ESP step of request") == 9             # each member's 3 chunks
    assert log.count("prompt tokens 768-1536 of 1599") == 3
    assert "recomputing" not in log                          # the KV was gathered, not redone
    counts = esp_counts(esp)
    assert counts == {("formed", "3"): 1.0, ("dissolved", "3"): 1.0}, counts
    assert esp.health()["esp_groups"] == []                  # nothing left held


@pytest.mark.parametrize("moment", ["formed", "first chunk"])
def test_a_member_killed_in_the_groups_step_ends_the_group_and_the_prompt_is_recomputed(
        daemon_factory, moment):
    """kill -9 of a member as soon as the group forms (before the members met, their wait
    ended by the controller's word -- or, killed between its arrival and the gloo group's
    forming, ESP_TIMEOUT_S later), or as soon as a member logs the first of the prefill's
    3 chunks (token budget 256: the others then wait for it at the second chunk's meeting,
    or fail in its collectives on the closed connection -- inside the prefill on a machine
    of any speed, where a fixed delay after the forming may come after its end): the
    group dissolves naming it, the master recomputes the prompt alone, and the request is
    answered once with one instance's greedy text."""
    expected = complete(daemon_factory(*torch_args(), "--layout", "1xsarathi"), LONG)
    esp = daemon_factory(*torch_args(), "--layout", "3xsarathi", "--esp-max-degree", "3",
                         "--esp-min-tokens", "1000", "--chunk-size", "256",
                         "--max-wait-slo-multiple", "1000000")
    pids = {i["id"]: i["pid"] for i in esp.health()["instances"]}
    with ThreadPoolExecutor(max_workers=1) as pool:
        answer = pool.submit(complete, esp, LONG)
        formed = wait_for(lambda: re.findall(r"over instances \[(.*)\] formed", esp.log()),
                          timeout=60, interval=0.01)
        victim = int(formed[0].split(", ")[1])
        if moment == "first chunk":
            wait_for(lambda: "prompt tokens 0-768 of 1599" in esp.log(), timeout=60,
                     interval=0.005)
        os.kill(pids[victim], signal.SIGKILL)
        assert answer.result(timeout=300) == expected
    log = esp.log()
    assert f"dissolved: instance {victim} stopped" in log, log
    assert esp.health()["esp_groups"] == []
