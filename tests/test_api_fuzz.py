"""Fuzzing the real daemon (sim executor, one instance process) from its own OpenAPI
description: schemathesis generates bodies that fit the schema (positive: each must be
served) and bodies that do not (negative: each must be a 4xx in OpenAI's error shape),
and hypothesis throws arbitrary bytes and JSON at the body endpoints. No answer may be
a 5xx, and afterwards the daemon is still up, healthy, with nothing left in flight.

Bounded: a fixed number of examples per operation, derandomized, no example database,
so it is deterministic and takes well under 30 s.

Covers: daemon/api.py, daemon/openapi.py, daemon/openai_schema.py.
"""
from __future__ import annotations

import json
import re

import pytest

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")
requests = pytest.importorskip("requests")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402

from tests.daemon_fixture import sim_args, start_daemon, wait_for  # noqa: E402

pytestmark = pytest.mark.slow  # fuzzes a daemon subprocess

API_KEY = "fuzz-key-5d1e"  # given through the environment, not a flag
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MAX_TOKENS_LIMIT = 8
EXAMPLES = {GenerationMode.POSITIVE: 75, GenerationMode.NEGATIVE: 100}
BODY_PATHS = ("/v1/completions", "/v1/chat/completions")
INT_AS_FLOAT = re.compile(r"Expected `int[^`]*`, got `float`")

FUZZ_SETTINGS = dict(deadline=None, database=None, derandomize=True, print_blob=True,
                     suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, daemon_cache, tiny_models):
    d = start_daemon(tmp_path_factory.mktemp("fuzz-daemon"), "--model", str(tiny_models["llama"]),
                     *sim_args(), "--max-tokens-limit", str(MAX_TOKENS_LIMIT),
                     "--default-max-tokens", "4", "--max-body-bytes", "65536",
                     "--served-model-name", "tiny", cache_dir=daemon_cache,
                     env={"ASCENDRA_API_KEY": API_KEY})
    yield d
    d.close()


@pytest.fixture(scope="module")
def session():
    with requests.Session() as s:
        yield s


@pytest.fixture(scope="module")
def api_schema(daemon):
    status, spec = daemon.get_json("/openapi.json")  # served without the key
    assert status == 200
    schema = schemathesis.openapi.from_dict(spec)
    schema.validate()
    return schema


def check_answer(response, mode: GenerationMode | None = None) -> None:
    """No 5xx; every error JSON in OpenAI's shape; a body that fits the schema is served."""
    status = response.status_code
    body = response.content
    assert status < 500, (status, body[:500])
    if status >= 400:
        content_type = {k.lower(): v for k, v in response.headers.items()}["content-type"]
        if isinstance(content_type, list):  # schemathesis: lists of values
            content_type = content_type[0]
        assert content_type.startswith("application/json"), (status, body[:200])
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    if mode is GenerationMode.POSITIVE and response.request.path_url in BODY_PATHS:
        # Only what the schema cannot say may refuse a body that fits it: a text prompt
        # (or chat) longer than the context, or max_tokens that does not fit beside its
        # prompt; more than MAX_CHOICES choices (n x prompts); and a JSON Schema
        # "integer" written as a float (1.0), which the strict decoder refuses as a float.
        if status != 200:
            assert status == 400 and ("context length" in error["message"]
                                      or "choices per request" in error["message"]
                                      # one message object for every role: the schema
                                      # cannot say only an assistant's may omit content
                                      or "may leave out its content" in error["message"]
                                      or INT_AS_FLOAT.search(error["message"])), error


def operations(api_schema):
    return [result.ok() for result in api_schema.get_all_operations()]


@pytest.mark.parametrize("mode", list(EXAMPLES), ids=str)
def test_schemathesis_fuzz_gets_no_5xx(daemon, session, api_schema, mode):
    for operation in operations(api_schema):
        if mode is GenerationMode.NEGATIVE and operation.path not in BODY_PATHS:
            continue  # nothing to negate: no body, no parameters
        @settings(max_examples=EXAMPLES[mode], **FUZZ_SETTINGS)
        @given(case=operation.as_strategy(generation_mode=mode))
        def fuzz(case):
            response = case.call(base_url=daemon.base_url, session=session, headers=AUTH,
                                 timeout=15)
            check_answer(response, mode)

        fuzz()
    assert_still_serving(daemon)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
FIELDS = st.sampled_from(["prompt", "messages", "max_tokens", "max_completion_tokens",
                          "temperature", "top_p", "top_k", "seed", "stop", "stream",
                          "stream_options", "n", "model", "priority", "ttft_slo", "tbt_slo",
                          "ignore_eos", "echo", "logprobs", "top_logprobs", "role", "content",
                          "presence_penalty", "frequency_penalty", "logit_bias", "best_of",
                          "suffix", "response_format", "tools", "tool_choice", "functions",
                          "modalities", "audio", "min_p", "user", "guided_json", "guided_regex",
                          "guided_choice", "structured_outputs"])
BODIES = st.dictionaries(FIELDS, JSON_VALUES, max_size=6).map(json.dumps).map(str.encode) \
    | st.binary(max_size=256)


@settings(max_examples=100, **FUZZ_SETTINGS)
@given(path=st.sampled_from(BODY_PATHS), body=BODIES,
       content_type=st.sampled_from(["application/json", "text/plain", "text/xml", None]))
def test_arbitrary_bytes_and_json_get_no_5xx(daemon, session, path, body, content_type):
    headers = dict(AUTH, **({"Content-Type": content_type} if content_type else {}))
    response = session.post(daemon.base_url + path, data=body, headers=headers, timeout=15)
    check_answer(response)


@pytest.mark.parametrize("path,head", [("/v1/completions", '{"prompt": "hi", '),
                                       ("/v1/chat/completions",
                                        '{"messages": [{"role": "user", "content": "hi"}], ')])
def test_json_nested_deeper_than_the_decoder_goes_is_a_400(daemon, session, path, head):
    for nested in ('{"a": ' * 1000 + "1" + "}" * 1000, "[" * 20000 + "]" * 20000):
        response = session.post(daemon.base_url + path, data=head + '"x": ' + nested + "}",
                                headers=AUTH, timeout=15)
        check_answer(response)
        assert response.status_code == 400 and "nested" in response.json()["error"]["message"]


def test_the_daemon_is_still_up_with_nothing_in_flight(daemon):
    assert_still_serving(daemon)
    assert "Traceback" not in daemon.log(), daemon.log()[-3000:]


def test_the_environment_api_key_guards_v1(daemon):
    assert daemon.request("GET", "/v1/models")[0] == 401
    assert daemon.request("GET", "/v1/models", headers={"Authorization": "Bearer nope"})[0] == 401
    assert daemon.request("GET", "/v1/models", headers=AUTH)[0] == 200


def assert_still_serving(daemon) -> None:
    assert daemon.proc.poll() is None, daemon.log()[-3000:]
    health = wait_for(lambda: (h := daemon.health())["requests_in_flight"] == 0 and h, 10,
                      what="no request left in flight")
    assert health["status"] == "ok"
    assert all(i["restarts"] == 0 and i["state"] == "ready" for i in health["instances"])
    status, body = daemon.post_json("/v1/completions", {"prompt": "Hi", "max_tokens": 2},
                                    headers=AUTH)
    assert status == 200 and body["usage"]["completion_tokens"] == 2, body
