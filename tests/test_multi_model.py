"""Several models in one daemon (issue #18, MuxServe's setting, live): `--model` repeated or a
TOML list, each model under its own name with its own layout and instances; a request's
`model` picks that model's instances, an unknown one is a 404 in OpenAI's shape; /v1/models,
/health and /metrics show every model. Config and API in-process; the daemon end to end
(torch executor, two tiny models of different seeds) is marked slow.

Covers: daemon/model_plan.py, daemon/served_models.py.
"""
from __future__ import annotations

import contextlib
import io
import json
import re

import openai
import pytest

from daemon.cli import build_parser, main
from daemon.config import config_from_args, load_config
from daemon.served_models import ServedModels
from tests.api_fakes import LIMITS, FakeController, api_client, assert_openai_error, call
from tests.daemon_fixture import start_daemon, torch_args, wait_for


def _config(*flags: str):
    return config_from_args(build_parser().parse_args(["serve", *flags]))


def _plans(config) -> list[tuple[str, str, str, list[int], list[tuple[int, ...]]]]:
    return [(p.name, p.folder, p.layout, [s.index for s in p.instances],
             [s.gpus for s in p.instances]) for p in config.model_plans()]


# ---- config -------------------------------------------------------------------------------

def test_one_model_is_served_as_before():
    assert _plans(_config()) == [("tiny-llama-seed0", "", "1A", [0], [()])]
    config = _config("--model", "/m/llama", "--served-model-name", "tiny", "--layout", "2L1H")
    assert config.model.model == "/m/llama"  # one flag: a text, not a list
    assert _plans(config) == [("tiny", "/m/llama", "2L1H", [0, 1, 2], [(), (), ()])]


def test_the_default_layout_is_ascendras_with_an_instance_per_gpu_listed():
    assert _plans(_config("--gpus", "0,1,2")) == [
        ("tiny-llama-seed0", "", "3A", [0, 1, 2], [(0,), (1,), (2,)])]
    assert _plans(_config("--gpus", "0,1,2,3", "--gpus-per-instance", "2"))[0][2] == "2A"
    two = _config("--model", "/m/a", "--model", "/m/b", "--gpus", "0,1,2,3")
    assert [p[2] for p in _plans(two)] == ["2A", "2A"]
    assert _plans(_config("--layout", "3xsarathi"))[0][2] == "3xsarathi"  # a baseline by name


def test_model_repeated_serves_each_folder_under_its_name_with_its_layout_and_gpus():
    config = _config("--model", "/m/llama", "--model", "/m/qwen/", "--layout", "2L1H",
                     "--layout", "1xsarathi", "--gpus", "0,1,2,3")
    assert config.model.model == ["/m/llama", "/m/qwen/"]
    assert _plans(config) == [("llama", "/m/llama", "2L1H", [0, 1, 2], [(0,), (1,), (2,)]),
                              ("qwen", "/m/qwen/", "1xsarathi", [3], [(3,)])]
    one_layout = _config("--model", "/m/a", "--model", "/m/b", "--served-model-name", "x",
                         "--served-model-name", "y", "--layout", "1xvllm")
    assert _plans(one_layout) == [("x", "/m/a", "1xvllm", [0], [()]),
                                  ("y", "/m/b", "1xvllm", [1], [()])]


def test_the_toml_config_takes_lists_and_flags_win(tmp_path):
    path = tmp_path / "serve.toml"
    path.write_text('[model]\nmodel = ["/m/a", "/m/b"]\nserved_model_name = ["alpha", ""]\n'
                    '[instances]\nlayout = ["1xsarathi", "1L1H"]\n')
    config = load_config(str(path))
    assert _plans(config) == [("alpha", "/m/a", "1xsarathi", [0], [()]),
                              ("b", "/m/b", "1L1H", [1, 2], [(), ()])]
    flags = build_parser().parse_args(["serve", "--config", str(path), "--layout", "1xvllm"])
    assert [p.layout for p in config_from_args(flags).model_plans()] == ["1xvllm", "1xvllm"]


@pytest.mark.parametrize("flags, field, words", [
    (["--model", "/x/tiny", "--model", "/y/tiny"], "model.served_model_name",
     ["two models are named 'tiny'", "/x/tiny", "/y/tiny"]),
    (["--model", "/m/a", "--model", "/m/b", "--served-model-name", "same",
      "--served-model-name", "same"], "model.served_model_name", ["'same'"]),
    (["--model", "/m/a", "--model", "/m/b", "--served-model-name", "one"],
     "model.served_model_name", ["1 name(s) for 2 models"]),
    (["--model", "/m/a", "--model", "/m/b", "--layout", "1xsarathi", "--layout", "2L1H",
      "--layout", "1xvllm"], "instances.layout", ["3 layout(s) for 2 models"]),
    (["--model", "/m/a", "--model", "/m/b", "--layout", "2L1H", "--gpus", "0,1,2,3"],
     "instances.gpus", ["need 6 GPUs", "lists 4"]),
    (["--model", "/m/a", "--model", "/m/b", "--layout", "1xsarathi", "--layout", "2xnope"],
     "layout", ["unknown mode 'nope'"]),
])
def test_a_bad_model_list_stops_serve_with_exit_2_naming_the_field(flags, field, words, capsys):
    with pytest.raises(ValueError) as info:
        _config(*flags)
    message = str(info.value)
    assert f"{field}: " in message and all(w in message for w in words), message
    assert main(["serve", *flags]) == 2  # stops before anything starts
    assert f"{field}: " in capsys.readouterr().err


# ---- the API over two (fake) models ---------------------------------------------------------

@pytest.fixture
def two_models(tokenizer):
    """Two fake controllers answering different tokens, `alpha` (the first) and `beta`."""
    a, b = (tokenizer.encode(t, add_bos=False)[0] for t in ("a", "b"))
    return (FakeController(tokenizer, model_name="alpha", max_model_len=64, token_id=a),
            FakeController(tokenizer, model_name="beta", max_model_len=48, token_id=b))


def _serve_both(two_models):
    """The real app over both, as `serve` builds it."""
    return api_client(ServedModels(list(two_models)), **LIMITS)


async def test_the_request_model_picks_its_models_controller(two_models):
    alpha, beta = two_models
    async with _serve_both(two_models) as client:
        texts = {}
        for name in ("alpha", "beta", None):
            body = {"prompt": "Hi", "max_tokens": 3, **({"model": name} if name else {})}
            resp, raw = await call(client, "POST", "/v1/completions", body)
            assert resp.status == 200, raw
            answer = json.loads(raw)
            assert answer["model"] == (name or "alpha")
            texts[name] = answer["choices"][0]["text"]
        resp, raw = await call(client, "POST", "/v1/chat/completions", {
            "model": "beta", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert resp.status == 200 and json.loads(raw)["model"] == "beta"
    assert texts["alpha"] == texts[None] == "aaa" and texts["beta"] == "bbb"
    assert (len(alpha.submitted), len(beta.submitted)) == (2, 2)  # no model: the first one


async def test_an_unknown_model_is_404_in_openais_shape(two_models):
    async with _serve_both(two_models) as client:
        for method, path, body in [("POST", "/v1/completions", {"prompt": "Hi", "model": "gamma"}),
                                   ("POST", "/v1/chat/completions", {"model": "gamma", "messages": [
                                       {"role": "user", "content": "Hi"}]}),
                                   ("GET", "/v1/models/gamma", None)]:
            resp, raw = await call(client, method, path, body)
            assert resp.status == 404, raw
            error = assert_openai_error(json.loads(raw), 404, "'gamma' does not exist", "'alpha'",
                                        "'beta'", param="model")
            assert error["code"] == "model_not_found"
    assert not two_models[0].submitted and not two_models[1].submitted


async def test_models_health_metrics_and_openapi_show_every_model(two_models):
    async with _serve_both(two_models) as client:
        resp, raw = await call(client, "GET", "/v1/models")
        assert [(m["id"], m["max_model_len"]) for m in json.loads(raw)["data"]] == [
            ("alpha", 64), ("beta", 48)]
        resp, raw = await call(client, "GET", "/v1/models/beta")
        assert resp.status == 200 and json.loads(raw)["id"] == "beta"
        await call(client, "POST", "/v1/completions", {"prompt": "Hi", "model": "beta",
                                                       "max_tokens": 2})
        resp, raw = await call(client, "GET", "/health")
        health = json.loads(raw)
        assert resp.status == 200 and health["status"] == "ok" and health["model"] == "alpha"
        assert [m["name"] for m in health["models"]] == ["alpha", "beta"]
        resp, raw = await call(client, "GET", "/metrics")
        text = raw.decode()
        assert len(re.findall(r"^# TYPE ascendra_output_tokens\S* counter$", text, re.M)) == 1
        assert 'ascendra_output_tokens_total{model="alpha"} 0.0' in text
        resp, raw = await call(client, "GET", "/openapi.json")
        model = json.loads(raw)["components"]["schemas"]["CompletionRequest"]["properties"]["model"]
        assert model["anyOf"][0]["enum"] == ["alpha", "beta"]


# ---- the daemon, end to end -------------------------------------------------------------------

PROMPT = "Paged attention is"
MAX_TOKENS = 12


def _make_tiny_model(folder, seed: int) -> str:
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["make-tiny-model", str(folder), "--seed", str(seed)]) == 0
    return str(folder)


def _generate(folder: str) -> str:
    """What `ascendra generate` (one engine in-process, greedy) answers on that model."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["generate", "--json", "--model", folder, "--device", "cpu", "--max-tokens",
                     str(MAX_TOKENS), "--ignore-eos", "--prompt", PROMPT]) == 0
    return json.loads(out.getvalue().splitlines()[0])["text"]


@pytest.mark.slow
def test_two_models_in_one_daemon_each_served_by_its_own_instances(tmp_path, daemon_cache):
    folders = {"alpha": _make_tiny_model(tmp_path / "seed1", 1),
               "beta": _make_tiny_model(tmp_path / "seed2", 2)}
    expected = {name: _generate(folder) for name, folder in folders.items()}
    assert expected["alpha"] != expected["beta"]  # different weights, different answers
    daemon = start_daemon(tmp_path / "daemon", "--model", folders["alpha"], "--model",
                          folders["beta"], "--served-model-name", "alpha", "--served-model-name",
                          "beta", "--layout", "1xsarathi", "--layout", "2xsarathi", *torch_args(),
                          cache_dir=daemon_cache, timeout=180)
    client = openai.OpenAI(base_url=daemon.base_url + "/v1", api_key="none", max_retries=0,
                           timeout=60)
    try:
        assert [m.id for m in client.models.list().data] == ["alpha", "beta"]
        assert client.models.retrieve("beta").id == "beta"
        for name in ("alpha", "beta", "beta"):
            done = client.completions.create(model=name, prompt=PROMPT, max_tokens=MAX_TOKENS,
                                             temperature=0, extra_body={"ignore_eos": True})
            assert done.model == name and done.choices[0].text == expected[name], name
        with pytest.raises(openai.NotFoundError) as info:
            client.completions.create(model="gamma", prompt=PROMPT, max_tokens=2)
        error = info.value.body
        assert error["code"] == "model_not_found" and error["param"] == "model"
        assert "'gamma' does not exist" in error["message"]

        def served_by_model():
            health = daemon.health()
            served = {}
            for instance in health["instances"]:
                served.setdefault(instance["model"], []).append((instance["id"],
                                                                 instance["served"]))
            totals = {m: sum(n for _, n in ids) for m, ids in served.items()}
            return (health, served) if totals == {"alpha": 1, "beta": 2} else None

        health, served = wait_for(served_by_model, 10, what="every instance's served count")
        assert [i for i, _ in served["alpha"]] == [0] and [i for i, _ in served["beta"]] == [1, 2]
        assert [(m["name"], m["status"]) for m in health["models"]] == [("alpha", "ok"),
                                                                        ("beta", "ok")]
        metrics = daemon.request("GET", "/metrics")[2].decode()
        completed = {m: float(v) for m, v in re.findall(
            r'^ascendra_requests_total\{model="(\w+)",outcome="completed"\} (\S+)$', metrics, re.M)}
        assert completed == {"alpha": 1.0, "beta": 2.0}
    finally:
        client.close()
        daemon.close()
