"""MuxServe live: `serve --model A --model B --placement multiplexed` -- every instance
holds both tiny models (different seeds) and one KV pool; each request is answered by
its model (the same greedy text as that model alone), under a mixed 80/20 load every
request is answered exactly once, an unknown model is a 404 naming it, and /health and
/metrics show each model's KV blocks on each instance. The config's grouping is checked
in-process; the daemon end to end (torch executor on the CPU) is marked slow.

Covers: daemon/model_plan.py, daemon/served_models.py, daemon/serve_cmd.py, engines/instance_main.py, engines/mux_build.py.
"""
from __future__ import annotations

import asyncio
import re

import openai
import pytest

from daemon.cli import build_parser
from daemon.config import config_from_args
from tests.daemon_fixture import start_daemon, torch_args
from tests.test_multi_model import MAX_TOKENS, PROMPT, _generate, _make_tiny_model


def _config(*flags: str):
    return config_from_args(build_parser().parse_args(["serve", *flags]))


def test_multiplexed_placement_puts_every_model_on_one_group_of_instances():
    [plan] = _config("--model", "/m/a", "--model", "/m/b", "--served-model-name", "a",
                     "--served-model-name", "b", "--placement", "multiplexed",
                     "--layout", "2xsarathi").model_plans()
    assert plan.names == ["a", "b"] and [s.index for s in plan.instances] == [0, 1]


def test_placement_per_model_groups_some_and_leaves_others_dedicated():
    plans = _config("--model", "/m/a", "--model", "/m/b", "--model", "/m/c",
                    "--served-model-name", "a", "--served-model-name", "b",
                    "--served-model-name", "c", "--placement", "g", "--placement", "dedicated",
                    "--placement", "g", "--layout", "1xsarathi").model_plans()
    assert [(p.names, [s.index for s in p.instances]) for p in plans] == [
        (["a", "c"], [0]), (["b"], [1])]


@pytest.mark.parametrize("flags, words", [
    (["--placement", "shared"], "neither"),
    (["--placement", "g", "--placement", "g", "--placement", "g"], "3 entries for 2 models"),
    (["--placement", "multiplexed", "--layout", "1P1D"], "P/D layouts"),
])
def test_a_bad_placement_is_a_config_error_naming_the_field(flags, words):
    with pytest.raises(ValueError, match=f"model.placement: .*{words}"):
        _config("--model", "/m/a", "--model", "/m/b", "--served-model-name", "a",
                "--served-model-name", "b", *flags)


@pytest.mark.slow
def test_two_models_multiplexed_on_every_instance_answer_every_request_once(
        tmp_path, daemon_cache):
    folders = {"alpha": _make_tiny_model(tmp_path / "seed1", 1),
               "beta": _make_tiny_model(tmp_path / "seed2", 2)}
    expected = {name: _generate(folder) for name, folder in folders.items()}
    assert expected["alpha"] != expected["beta"]
    daemon = start_daemon(tmp_path / "daemon", "--model", folders["alpha"], "--model",
                          folders["beta"], "--served-model-name", "alpha", "--served-model-name",
                          "beta", "--placement", "multiplexed", "--layout", "2xsarathi",
                          *torch_args(), cache_dir=daemon_cache, timeout=180)
    client = openai.AsyncOpenAI(base_url=daemon.base_url + "/v1", api_key="none",
                                max_retries=0, timeout=120)

    async def mixed_load():
        names = ["alpha" if i % 5 else "beta" for i in range(30)]  # 80 / 20
        answers = await asyncio.gather(*(client.completions.create(
            model=name, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
            extra_body={"ignore_eos": True}) for name in names))
        return names, answers

    try:
        names, answers = asyncio.run(mixed_load())
        assert len({a.id for a in answers}) == len(names)  # each answered, once
        for name, answer in zip(names, answers):
            assert answer.model == name and answer.choices[0].text == expected[name], name
        sync = openai.OpenAI(base_url=daemon.base_url + "/v1", api_key="none", max_retries=0)
        assert [m.id for m in sync.models.list().data] == ["alpha", "beta"]
        with pytest.raises(openai.NotFoundError) as info:
            sync.completions.create(model="gamma", prompt=PROMPT, max_tokens=2)
        assert info.value.body["param"] == "model" and "'gamma'" in info.value.body["message"]
        health = daemon.health()
        assert [i["models"] for i in health["instances"]] == [["alpha", "beta"]] * 2
        assert all(set(i["kv_blocks_by_model"]) == {"alpha", "beta"}
                   for i in health["instances"])
        assert sum(i["served"] for i in health["instances"]) == len(names)
        metrics = daemon.request("GET", "/metrics")[2].decode()
        assert set(re.findall(r'^ascendra_instance_model_kv_blocks\{[^}]*model="(\w+)"',
                              metrics, re.M)) == {"alpha", "beta"}
    finally:
        daemon.close()


def test_groups_put_a_model_multiplexed_on_some_instances_and_dedicated_on_others():
    plans = _config("--model", "/m/a", "--model", "/m/b", "--served-model-name", "a",
                    "--served-model-name", "b", "--groups", "a+b:2xsarathi,a:1xsarathi",
                    ).model_plans()
    assert [(p.label, p.names, [s.index for s in p.instances]) for p in plans] == [
        ("a+b", ["a", "b"], [0, 1]), ("a", ["a"], [2])]
    for flags, words in ((["--groups", "a+c:1xsarathi"], "'c' is not served"),
                         (["--groups", "a:1xsarathi"], "'b' is in no group"),
                         (["--groups", "a+b:1xsarathi", "--placement", "multiplexed"],
                          "leave model.placement")):
        with pytest.raises(ValueError, match=f"model.groups: .*{words}"):
            _config("--model", "/m/a", "--model", "/m/b", "--served-model-name", "a",
                    "--served-model-name", "b", *flags)


class _Group:
    """A controller as ServedModels reads it: names, and a load."""

    def __init__(self, names, in_flight, ready):
        self.model_name, self.model_names = "+".join(names), names
        self.tokenizer, self.vocab_size, self.tenants = None, 0, None
        self.view = type("View", (), {"requests_in_flight": in_flight,
                                      "ready_ids": lambda _: list(range(ready))})()


def test_a_model_held_by_several_groups_goes_to_the_least_loaded():
    from daemon.errors import ApiError
    from daemon.served_models import ServedModels
    mux, own = _Group(["a", "b"], in_flight=6, ready=2), _Group(["a"], in_flight=1, ready=1)
    served = ServedModels([mux, own])
    assert served.names == ["a", "b"] and [p.model_name for p in served.ports] == ["a", "b"]
    assert served.pick("a").controller is own          # 1 per instance < 3
    own.view.requests_in_flight = 4
    assert served.pick("a").controller is mux          # 3 per instance < 4
    assert served.pick("b").controller is mux and served.pick("").model_name == "a"
    with pytest.raises(ApiError):
        served.pick("c")


@pytest.mark.slow
def test_a_model_multiplexed_on_some_instances_and_dedicated_on_another(tmp_path, daemon_cache):
    folders = {"alpha": _make_tiny_model(tmp_path / "seed1", 1),
               "beta": _make_tiny_model(tmp_path / "seed2", 2)}
    expected = {name: _generate(folder) for name, folder in folders.items()}
    daemon = start_daemon(tmp_path / "daemon", "--model", folders["alpha"], "--model",
                          folders["beta"], "--served-model-name", "alpha", "--served-model-name",
                          "beta", "--groups", "alpha+beta:1xsarathi,alpha:1xsarathi",
                          *torch_args(), cache_dir=daemon_cache, timeout=180)
    client = openai.AsyncOpenAI(base_url=daemon.base_url + "/v1", api_key="none",
                                max_retries=0, timeout=120)

    async def load():
        names = ["alpha" if i % 4 else "beta" for i in range(24)]
        return names, await asyncio.gather(*(client.completions.create(
            model=name, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
            extra_body={"ignore_eos": True}) for name in names))

    try:
        names, answers = asyncio.run(load())
        assert len({a.id for a in answers}) == len(names)
        assert all(a.choices[0].text == expected[n] for n, a in zip(names, answers))
        served = {i["id"]: (i["models"], i["served"]) for i in daemon.health()["instances"]}
        assert served[0][0] == ["alpha", "beta"] and served[1][0] == []
        assert served[1][1] > 0, "the dedicated instance took some of alpha's requests"
        assert served[0][1] + served[1][1] == len(names)
    finally:
        daemon.close()
