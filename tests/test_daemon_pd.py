"""A P/D layout (DistServe, `1P1D`) end to end: the real daemon, torch executor. Each
request's prompt runs on the prefill instance, its KV crosses to the decode instance as
raw ZeroMQ frames, and greedy output equals a single instance's token for token.

Covers: engines/handoff.py, engines/models/kv_transfer.py, daemon/core/handoffs.py.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.slow  # two daemon subprocesses with torch instances

PROMPTS = ["The library was quiet except for", "Once upon a time", "a" * 150,
           "Numbers: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"]


def completions(daemon) -> list[str]:
    def one(prompt):
        body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        status, _, raw = daemon.request("POST", "/v1/completions", body)
        assert status == 200, raw
        return json.loads(raw)["choices"][0]["text"]

    with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        return list(pool.map(one, PROMPTS))


def test_1p1d_greedy_output_equals_one_instance(daemon_factory):
    single = daemon_factory("--executor", "torch", "--device", "cpu")
    expected = completions(single)
    pd = daemon_factory("--layout", "1P1D", "--executor", "torch", "--device", "cpu",
                        "--block-size", "16", "--num-kv-blocks", "256")
    assert [i["role"] for i in pd.health()["instances"]] == ["prefill", "decode"]
    assert completions(pd) == expected
    _, _, metrics = pd.request("GET", "/metrics")
    served = {line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
              for line in metrics.decode().splitlines()
              if line.startswith("ascendra_instance_served_total{")}
    assert served.get('instance="1",role="decode"') == len(PROMPTS)
    assert "recomputing" not in pd.log()  # the KV crossed: no prompt ran twice
