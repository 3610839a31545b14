"""End to end: the real daemon (torch executor, tiny model, CPU) through the official
`openai` client and raw HTTP. One daemon serves the whole module.

Covers: daemon/api.py, daemon/controller.py, engines/instance.py.
"""
from __future__ import annotations

import json
import re

import openai
import pytest

from tests.daemon_fixture import start_daemon, torch_args, wait_for

pytestmark = pytest.mark.slow  # against a daemon subprocess

API_KEY = "test-key-3f9c"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MODEL = "tiny"
PROMPTS = ["Hello, Ascendra", "Paged attention is"]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, daemon_cache, tiny_models):
    d = start_daemon(tmp_path_factory.mktemp("api-daemon"), "--model", str(tiny_models["llama"]),
                     # the API, not scheduling, is under test: a baseline that queues, where
                     # the default 1A sheds what it predicts will miss 1 s on a busy CPU
                     *torch_args(), "--layout", "1xsarathi", "--api-key", API_KEY,
                     "--served-model-name", MODEL,
                     cache_dir=daemon_cache)
    yield d
    d.close()


@pytest.fixture(scope="module")
def client(daemon):
    c = openai.OpenAI(base_url=daemon.base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    yield c
    c.close()


@pytest.fixture(scope="module")
def generated(tiny_models):
    """`ascendra generate --json` (run in-process) on PROMPTS: greedy, 24 tokens."""
    import contextlib
    import io

    from daemon.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["generate", "--json", "--model", str(tiny_models["llama"]), "--device", "cpu",
                     "--max-tokens", "24", *[a for p in PROMPTS for a in ("--prompt", p)]])
    assert code == 0
    lines = out.getvalue().splitlines()  # JSON Lines: one object per prompt, in order
    assert len(lines) == len(PROMPTS)
    return {r["prompt"]: r for r in map(json.loads, lines)}


def _assert_error_shape(body: dict, *words: str) -> str:
    """An OpenAI-shaped error whose message contains every one of `words`."""
    assert set(body) == {"error"}, body
    error = body["error"]
    assert {"message", "type", "param", "code"} <= set(error), error
    assert isinstance(error["message"], str) and isinstance(error["type"], str)
    for word in words:
        assert word in error["message"], (word, error["message"])
    return error["message"]


def _idle(daemon) -> dict | None:
    health = daemon.health()
    instances = health["instances"]
    if health["requests_in_flight"] == 0 and all(
            i["in_flight"] == 0 and i["kv_blocks_used"] == 0 and i["waiting"] == 0
            and i["running"] == 0 for i in instances):
        return health
    return None


# ---- completions ------------------------------------------------------------------------

@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_completion_equals_ascendra_generate(client, generated, prompt):
    expected = generated[prompt]
    resp = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
    choice = resp.choices[0]
    assert resp.object == "text_completion" and resp.model == MODEL
    assert choice.text == expected["text"]
    assert choice.finish_reason == expected["finish_reason"]
    assert resp.usage.prompt_tokens == len(expected["prompt_token_ids"])
    assert resp.usage.completion_tokens == len(expected["token_ids"])
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    # The same prompt as token ids gives the same completion.
    by_ids = client.completions.create(model=MODEL, prompt=expected["prompt_token_ids"],
                                       max_tokens=24, temperature=0)
    assert by_ids.choices[0].text == expected["text"]


def test_streaming_completion_equals_non_streaming(client, generated):
    prompt = PROMPTS[0]
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=24,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    *content, last = chunks
    assert last.choices == [] and last.usage is not None
    assert "".join(c.choices[0].text for c in content) == generated[prompt]["text"]
    finishes = [c.choices[0].finish_reason for c in content]
    assert finishes[-1] == generated[prompt]["finish_reason"] and not any(finishes[:-1])
    assert last.usage.prompt_tokens == len(generated[prompt]["prompt_token_ids"])
    assert last.usage.completion_tokens == len(generated[prompt]["token_ids"])
    assert len({c.id for c in chunks}) == 1


def test_ignore_eos_and_slo_extension_fields(client):
    resp = client.completions.create(
        model=MODEL, prompt="Hi", max_tokens=40, temperature=0,
        extra_body={"ignore_eos": True, "ttft_slo": 0.5, "tbt_slo": 0.1, "priority": 3})
    assert resp.usage.completion_tokens == 40
    assert resp.choices[0].finish_reason == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_ends_the_text_before_it(client, stream):
    full = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=24,
                                     temperature=0, extra_body={"ignore_eos": True})
    text = full.choices[0].text
    assert len(text) >= 12, text
    stop = text[6:9]
    expected = text[:text.find(stop)]
    kwargs = dict(model=MODEL, prompt=PROMPTS[1], max_tokens=24, temperature=0, stop=[stop],
                  extra_body={"ignore_eos": True})
    if stream:
        chunks = list(client.completions.create(stream=True, **kwargs))
        got = "".join(c.choices[0].text for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        resp = client.completions.create(**kwargs)
        got, finish = resp.choices[0].text, resp.choices[0].finish_reason
    assert got == expected
    assert finish == "stop"


# ---- chat -------------------------------------------------------------------------------

CHAT = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def chat_expected(tiny_models, tokenizer):
    """Greedy tokens of CHAT from an in-process instance (engines/offline.py; no daemon)."""
    from engines.executors.torch_executor import TorchExecutor
    from engines.offline import Offline
    from engines.scheduler import SchedulerConfig
    from ipc.params import SamplingParams
    offline = Offline(TorchExecutor(tiny_models["llama"], num_kv_blocks=64, device="cpu"),
                      SchedulerConfig())
    prompt = tokenizer.encode_chat(CHAT)
    done = offline.generate([prompt], SamplingParams(max_tokens=20, temperature=0.0))[0]
    return {"prompt_tokens": len(prompt), "completion_tokens": len(done.token_ids),
            "text": tokenizer.decode(done.token_ids), "finish_reason": done.finish_reason}


def test_chat_completion_equals_engine(client, chat_expected):
    resp = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=20, temperature=0)
    assert resp.object == "chat.completion"
    message = resp.choices[0].message
    assert message.role == "assistant"
    assert message.content == chat_expected["text"]
    assert resp.choices[0].finish_reason == chat_expected["finish_reason"]
    assert resp.usage.prompt_tokens == chat_expected["prompt_tokens"]
    assert resp.usage.completion_tokens == chat_expected["completion_tokens"]


def test_chat_streaming(client, chat_expected):
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=CHAT, max_completion_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    *content, last = chunks
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert content[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in content) == chat_expected["text"]
    assert content[-1].choices[0].finish_reason == chat_expected["finish_reason"]
    assert last.usage.completion_tokens == chat_expected["completion_tokens"]


# ---- refusals ---------------------------------------------------------------------------

def test_fields_we_cannot_honour_are_refused_naming_them(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4,
                                       reasoning_effort="high")
    assert info.value.status_code == 400 and info.value.param == "reasoning_effort"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4,
                                       functions=[{"name": "f", "parameters": {}}])
    assert info.value.param == "functions" and re.search(r"\bfunction", info.value.message)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, suffix="end")
    assert info.value.param == "suffix"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="no-such-model", prompt="Hi", max_tokens=4)
    assert "model" in info.value.message and "no-such-model" in info.value.message


def test_prompt_longer_than_the_context_states_the_limit(client, daemon):
    max_len = daemon.get_json("/v1/models", headers=AUTH)[1]["data"][0]["max_model_len"]
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=[5] * max_len, max_tokens=4)
    assert "prompt" in info.value.message and str(max_len) in info.value.message


COMPLETION_BAD_BODIES = [
    ("not json", b"{prompt: 1", 400, ["JSON"]),
    ("array body", b"[1, 2]", 400, ["object"]),
    ("missing prompt", {"max_tokens": 4}, 400, ["prompt"]),
    ("prompt wrong type", {"prompt": 5}, 400, ["prompt"]),
    ("max_tokens wrong type", {"prompt": "Hi", "max_tokens": "many"}, 400, ["max_tokens"]),
    ("max_tokens 0", {"prompt": "Hi", "max_tokens": 0}, 400, ["max_tokens"]),
    ("max_tokens over limit", {"prompt": "Hi", "max_tokens": 10**6}, 400, ["max_tokens", "limit"]),
    ("temperature wrong type", {"prompt": "Hi", "temperature": "hot"}, 400, ["temperature"]),
    ("temperature out of range", {"prompt": "Hi", "temperature": 9}, 400, ["temperature"]),
    ("stream wrong type", {"prompt": "Hi", "stream": "yes"}, 400, ["stream"]),
    ("empty token list", {"prompt": []}, 400, ["prompt"]),
    ("token id outside vocab", {"prompt": [1, 10**7]}, 400, ["prompt", "vocabulary"]),
    ("negative token id", {"prompt": [-1]}, 400, ["prompt"]),
    ("too many stops", {"prompt": "Hi", "stop": ["a", "b", "c", "d", "e"]}, 400, ["stop"]),
    ("priority out of range", {"prompt": "Hi", "priority": 101}, 400, ["priority"]),
    ("ttft_slo not positive", {"prompt": "Hi", "ttft_slo": 0}, 400, ["ttft_slo"]),
    ("ignore_eos wrong type", {"prompt": "Hi", "ignore_eos": "no"}, 400, ["ignore_eos"]),
    ("penalty out of range", {"prompt": "Hi", "presence_penalty": 2.5}, 400, ["presence_penalty"]),
    ("n 0", {"prompt": "Hi", "n": 0}, 400, ["n"]),
    ("best_of over n", {"prompt": "Hi", "best_of": 3}, 400, ["best_of"]),
    ("logit_bias outside vocab", {"prompt": "Hi", "logit_bias": {"99999999": 1}}, 400,
     ["logit_bias"]),
    ("unknown model", {"prompt": "Hi", "model": "gpt-9"}, 404, ["model", "gpt-9"]),
]


@pytest.mark.parametrize("body,status,words", [c[1:] for c in COMPLETION_BAD_BODIES],
                         ids=[c[0] for c in COMPLETION_BAD_BODIES])
def test_bad_completion_bodies(daemon, body, status, words):
    got, headers, raw = daemon.request("POST", "/v1/completions", body, headers=AUTH)
    assert got == status, raw
    assert headers["content-type"].startswith("application/json")
    _assert_error_shape(json.loads(raw), *words)


CHAT_BAD_BODIES = [
    ("missing messages", {"max_tokens": 4}, ["messages"]),
    ("no messages", {"messages": []}, ["messages"]),
    ("bad role", {"messages": [{"role": "wizard", "content": "hi"}]}, ["role"]),
    ("content wrong type", {"messages": [{"role": "user", "content": 7}]}, ["content"]),
    ("max_completion_tokens 0", {"messages": [{"role": "user", "content": "hi"}],
                                 "max_completion_tokens": 0}, ["max_completion_tokens"]),
]


@pytest.mark.parametrize("body,words", [c[1:] for c in CHAT_BAD_BODIES],
                         ids=[c[0] for c in CHAT_BAD_BODIES])
def test_bad_chat_bodies(daemon, body, words):
    status, body = daemon.post_json("/v1/chat/completions", body, headers=AUTH)
    assert status == 400
    _assert_error_shape(body, *words)


def test_body_over_the_size_limit_is_413(daemon):
    status, _, raw = daemon.request("POST", "/v1/completions", b"x" * (2 << 20), headers=AUTH)
    assert status == 413
    _assert_error_shape(json.loads(raw), "limit")


# ---- API key ----------------------------------------------------------------------------

@pytest.mark.parametrize("method,path", [("GET", "/v1/models"), ("POST", "/v1/completions"),
                                         ("POST", "/v1/chat/completions")])
def test_v1_routes_need_the_api_key(daemon, method, path):
    body = {"prompt": "Hi", "max_tokens": 2} if method == "POST" else None
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        status, _, raw = daemon.request(method, path, body, headers=headers)
        assert status == 401, (headers, raw)
        assert json.loads(raw)["error"]["type"] == "authentication_error"
    assert daemon.request("GET", "/v1/models", headers=AUTH)[0] == 200


def test_health_and_metrics_need_no_key(daemon):
    assert daemon.request("GET", "/health")[0] == 200
    assert daemon.request("GET", "/metrics")[0] == 200


def test_openai_client_with_a_wrong_key_gets_authentication_error(daemon):
    bad = openai.OpenAI(base_url=daemon.base_url + "/v1", api_key="nope", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    bad.close()


# ---- models, health, metrics ------------------------------------------------------------

def test_models(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].object == "model"


def test_health_lists_every_instance(daemon):
    status, health = daemon.get_json("/health")
    assert status == 200
    assert health["status"] == "ok" and health["model"] == MODEL
    assert health["requests_in_flight"] == 0
    [instance] = health["instances"]
    assert instance["id"] == 0 and instance["role"] == "peer" and instance["mode"] == "sarathi"
    assert instance["state"] == "ready" and instance["restarts"] == 0
    assert isinstance(instance["pid"], int) and instance["pid"] != daemon.pid
    assert instance["kv_blocks_total"] == 512
    for key in ("in_flight", "waiting", "running", "kv_blocks_used", "preemptions"):
        assert isinstance(instance[key], int), key


def test_metrics_has_the_named_series(client, daemon):
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=4)
    names = ["ascendra_requests_total{outcome=\"completed\"}", "ascendra_ttft_seconds_bucket",
             "ascendra_tbt_seconds_bucket", "ascendra_e2e_seconds_bucket",
             "ascendra_output_tokens_total", "ascendra_instance_waiting{instance=\"0\"}",
             "ascendra_instance_running{instance=\"0\"}",
             "ascendra_instance_kv_usage{instance=\"0\"}",
             "ascendra_instance_preemptions{instance=\"0\"}"]

    def text():
        status, headers, body = daemon.request("GET", "/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain")
        body = body.decode()
        return body if all(n in body for n in names) else None

    body = wait_for(text, 10, what="every metric in /metrics")
    completed = re.search(r'^ascendra_requests_total\{outcome="completed"\} (\S+)$', body, re.M)
    assert float(completed.group(1)) >= 1


# ---- disconnects ------------------------------------------------------------------------

def test_client_disconnect_mid_stream_frees_the_request(client, daemon):
    wait_for(lambda: _idle(daemon), 10, what="an idle daemon before the test")
    stream = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=1900,
                                       temperature=0, stream=True, extra_body={"ignore_eos": True})
    try:
        for i, _ in enumerate(stream):
            if i == 3:
                break

        def holding_blocks():
            health = daemon.health()
            return health["requests_in_flight"] == 1 and health["instances"][0]["kv_blocks_used"] > 0

        wait_for(holding_blocks, 10, what="the streaming request to hold KV blocks")
    finally:
        stream.close()  # the client goes away mid-stream
    health = wait_for(lambda: _idle(daemon), 10, what="0 KV blocks used and 0 in flight")
    assert health["instances"][0]["state"] == "ready"
    body = daemon.request("GET", "/metrics")[2].decode()
    cancelled = re.search(r'^ascendra_requests_total\{outcome="cancelled"\} (\S+)$', body, re.M)
    assert cancelled and float(cancelled.group(1)) >= 1
    # The daemon still serves.
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).usage.completion_tokens


def test_client_disconnect_while_waiting_for_a_full_completion_frees_the_request(daemon):
    import socket
    wait_for(lambda: _idle(daemon), 10, what="an idle daemon before the test")
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 1900, "ignore_eos": True})
    sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=10)
    try:
        sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      f"Authorization: Bearer {API_KEY}\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        wait_for(lambda: daemon.health()["instances"][0]["kv_blocks_used"] > 0, 10,
                 what="the request to hold KV blocks")
    finally:
        sock.close()
    wait_for(lambda: _idle(daemon), 10, what="0 KV blocks used and 0 in flight")


@pytest.mark.parametrize("method,path,status", [("GET", "/v1/nothing", 404),
                                                ("GET", "/v1/completions", 405)])
def test_unknown_routes_get_json_errors(daemon, method, path, status):
    got, headers, raw = daemon.request(method, path, headers=AUTH)
    assert got == status and headers["content-type"].startswith("application/json")
    _assert_error_shape(json.loads(raw))


def test_health_and_metrics_count_served_requests_alike_at_once(client, daemon):
    """/health's `served` and /metrics' served counter read one source (the controller's
    settled requests): right after an answer, not a heartbeat later, they agree."""
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    _, health = daemon.get_json("/health")
    _, _, body = daemon.request("GET", "/metrics")
    counted = sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
                  if line.startswith("ascendra_instance_served_total{"))
    assert sum(i["served"] for i in health["instances"]) == counted >= 1


def test_tokenize_counts_a_prompt_as_the_completion_endpoints_do(client, daemon):
    """POST /tokenize (vLLM's shape) counts what /v1/completions and /v1/chat/completions
    bill as prompt tokens (the chat template included); bad input is a 400 naming it."""
    auth = {"Authorization": f"Bearer {API_KEY}"}
    status, counted = daemon.post_json("/tokenize", {"prompt": PROMPTS[0]}, headers=auth)
    billed = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=1)
    assert status == 200 and counted["count"] == billed.usage.prompt_tokens
    assert counted["count"] == len(counted["tokens"]) and counted["max_model_len"] > 0
    messages = [{"role": "user", "content": PROMPTS[1]}]
    _, chat = daemon.post_json("/tokenize", {"messages": messages}, headers=auth)
    billed = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert chat["count"] == billed.usage.prompt_tokens
    status, body = daemon.post_json("/tokenize", {"model": MODEL}, headers=auth)
    assert status == 400 and body["error"]["param"] == "prompt"


def test_bench_fits_chat_prompts_to_the_context_by_the_servers_own_count(daemon):
    """A chat prompt of more words than the context holds is trimmed to fit, counted by
    the server (`ascendra bench` does this before a chat run); one that cannot fit
    beside its output is skipped."""
    import asyncio

    from bench.loadgen.chat_fit import fit_chat_prompts
    from bench.loadgen.loadgen import chat_prompt
    from bench.loadgen.workload import WorkloadRequest
    _, models = daemon.get_json("/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    max_len = models["data"][0]["max_model_len"]
    long = WorkloadRequest(index=1, arrival=0.0, prompt_len=max_len, output_len=64)
    short = WorkloadRequest(index=2, arrival=0.0, prompt_len=10, output_len=64)
    hopeless = WorkloadRequest(index=3, arrival=0.0, prompt_len=10, output_len=max_len)
    fitted = asyncio.run(fit_chat_prompts(daemon.base_url, API_KEY, MODEL,
                                          [long, short, hopeless], max_len, seed=0))
    assert fitted.counted and fitted.trimmed == 1 and fitted.skipped == 1
    trimmed, kept = fitted.requests
    assert kept == short and trimmed.prompt_len < long.prompt_len
    _, count = daemon.post_json("/tokenize", {"messages": [
        {"role": "user", "content": chat_prompt(0, 1, trimmed.prompt_len)}]},
        headers={"Authorization": f"Bearer {API_KEY}"})
    assert count["count"] + long.output_len <= max_len
