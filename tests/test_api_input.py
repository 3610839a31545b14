"""Bad input at the HTTP edge: every error is JSON in OpenAI's error shape and names the
field (message and `param`); oversize bodies get 413, prompts longer than the context a
400 that states the limit, invalid values 400, non-JSON bodies 415, unknown routes 404
and wrong methods 405 -- all JSON. The app runs in-process over a fake controller
(tests/api_fakes.py); the real daemon's answers are fuzzed in test_api_fuzz.py.

Covers: daemon/openai_schema.py, daemon/openai_fields.py, daemon/errors.py.
"""
from __future__ import annotations

import json

import pytest

from tests.api_fakes import (
    CHAT, HI, LIMITS, MAX_MODEL_LEN, MAX_TOKENS_LIMIT, api_client, call, expect_error,
)

# ---- invalid bodies: 400 naming the field ---------------------------------------------------

COMPLETION_BAD = [
    # (id, body, words in the message, param)
    ("invalid JSON", b"{prompt: 1", ["JSON"], None),
    ("truncated JSON", b'{"prompt": "Hi"', ["JSON"], None),
    ("empty body", b"", ["JSON"], None),
    ("not UTF-8", b'{"prompt": "\xff\xfe"}', ["JSON"], None),
    ("array body", b"[1, 2]", ["object"], None),
    ("string body", b'"prompt"', ["object"], None),
    ("missing prompt", {"max_tokens": 4}, ["prompt"], "prompt"),
    ("prompt null", {"prompt": None}, ["prompt"], "prompt"),
    ("prompt a number", {"prompt": 5}, ["prompt"], "prompt"),
    ("prompt an object", {"prompt": {"text": "Hi"}}, ["prompt"], "prompt"),
    ("prompt mixed list", {"prompt": [1, "a"]}, ["prompt"], "prompt[1]"),
    ("empty token list", {"prompt": []}, ["prompt", "empty"], "prompt"),
    ("token id outside vocab", {"prompt": [1, 10**7]}, ["prompt", "vocabulary"], "prompt"),
    ("negative token id", {"prompt": [-1]}, ["prompt"], "prompt"),
    ("token id beyond int64", {"prompt": [2**70]}, ["prompt"], "prompt"),
    ("max_tokens a string", {**HI, "max_tokens": "many"}, ["max_tokens"], "max_tokens"),
    ("max_tokens a float", {**HI, "max_tokens": 1.5}, ["max_tokens"], "max_tokens"),
    ("max_tokens 0", {**HI, "max_tokens": 0}, ["max_tokens"], "max_tokens"),
    ("max_tokens negative", {**HI, "max_tokens": -5}, ["max_tokens"], "max_tokens"),
    ("max_tokens over the limit", {**HI, "max_tokens": MAX_TOKENS_LIMIT + 1},
     ["max_tokens", "limit", str(MAX_TOKENS_LIMIT)], "max_tokens"),
    ("max_tokens huge", {**HI, "max_tokens": 10**30}, ["max_tokens"], "max_tokens"),
    ("temperature a string", {**HI, "temperature": "hot"}, ["temperature"], "temperature"),
    ("temperature -1", {**HI, "temperature": -1}, ["temperature"], "temperature"),
    ("temperature 2.5", {**HI, "temperature": 2.5}, ["temperature"], "temperature"),
    ("temperature overflow", b'{"prompt": "Hi", "temperature": 1e400}', ["temperature"],
     "temperature"),
    ("top_p 0", {**HI, "top_p": 0}, ["top_p"], "top_p"),
    ("top_p 2", {**HI, "top_p": 2}, ["top_p"], "top_p"),
    ("top_p null", {**HI, "top_p": None}, ["top_p"], "top_p"),
    ("top_k -2", {**HI, "top_k": -2}, ["top_k"], "top_k"),
    ("top_k huge", {**HI, "top_k": 2**40}, ["top_k"], "top_k"),
    ("seed a string", {**HI, "seed": "7"}, ["seed"], "seed"),
    ("seed beyond int64", {**HI, "seed": 2**63}, ["seed"], "seed"),
    ("stream a string", {**HI, "stream": "yes"}, ["stream"], "stream"),
    ("stream_options wrong", {**HI, "stream": True, "stream_options": {"include_usage": 1}},
     ["stream_options.include_usage"], "stream_options.include_usage"),
    ("stop a number", {**HI, "stop": 3}, ["stop"], "stop"),
    ("stop empty string", {**HI, "stop": ""}, ["stop"], "stop"),
    ("stop with an empty string", {**HI, "stop": ["a", ""]}, ["stop"], "stop[1]"),
    ("five stops", {**HI, "stop": ["a", "b", "c", "d", "e"]}, ["stop"], "stop"),
    ("priority -101", {**HI, "priority": -101}, ["priority"], "priority"),   # -1 is sheddable
    ("priority 101", {**HI, "priority": 101}, ["priority"], "priority"),
    ("ttft_slo 0", {**HI, "ttft_slo": 0}, ["ttft_slo"], "ttft_slo"),
    ("ttft_slo negative", {**HI, "ttft_slo": -1.0}, ["ttft_slo"], "ttft_slo"),
    ("ttft_slo over a day", {**HI, "ttft_slo": 1e9}, ["ttft_slo"], "ttft_slo"),
    ("tbt_slo 0", {**HI, "tbt_slo": 0}, ["tbt_slo"], "tbt_slo"),
    ("ignore_eos a string", {**HI, "ignore_eos": "no"}, ["ignore_eos"], "ignore_eos"),
    ("n 0", {**HI, "n": 0}, ["n"], "n"),
    ("n 129", {**HI, "n": 129}, ["n"], "n"),
    ("n x prompts over 128", {"prompt": ["a"] * 10, "n": 13}, ["130 choices", "128"], "n"),
    ("presence_penalty 2.5", {**HI, "presence_penalty": 2.5}, ["presence_penalty"],
     "presence_penalty"),
    ("frequency_penalty -3", {**HI, "frequency_penalty": -3}, ["frequency_penalty"],
     "frequency_penalty"),
    ("logit_bias key not a token id", {**HI, "logit_bias": {"a": 1}}, ["logit_bias", "token id"],
     "logit_bias"),
    ("logit_bias id outside vocab", {**HI, "logit_bias": {"99999": 1}}, ["logit_bias", "1023"],
     "logit_bias"),
    ("logit_bias over 100", {**HI, "logit_bias": {"5": 101}}, ["logit_bias"], "logit_bias"),
    ("logit_bias a list", {**HI, "logit_bias": [5]}, ["logit_bias"], "logit_bias"),
    ("logprobs 6", {**HI, "logprobs": 6}, ["logprobs"], "logprobs"),
    ("logprobs true", {**HI, "logprobs": True}, ["logprobs"], "logprobs"),
    ("echo with logprobs", {**HI, "echo": True, "logprobs": 1}, ["logprobs", "echo"], "logprobs"),
    ("suffix", {**HI, "suffix": "end"}, ["suffix"], "suffix"),
    ("best_of over n", {**HI, "best_of": 2}, ["best_of"], "best_of"),
    ("response_format schema that does not compile", {**HI, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
     ["response_format.json_schema.schema", "compiled", "strin"],
     "response_format.json_schema.schema"),
    ("response_format json_schema without its schema", {**HI, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x"}}},
     ["needs its schema"], "response_format.json_schema.schema"),
    ("response_format unknown type", {**HI, "response_format": {"type": "xml"}},
     ["response_format.type"], "response_format.type"),
    ("vLLM's min_p", {**HI, "min_p": 0.1}, ["min_p"], "min_p"),
    ("vLLM's guided_json that does not compile", {**HI, "guided_json": {
        "type": "object", "properties": {"a": {"type": 5}}}}, ["guided_json"], "guided_json"),
    ("vLLM's guided_regex that does not compile", {**HI, "guided_regex": "a(b"},
     ["guided_regex"], "guided_regex"),
    ("two structured outputs at once", {**HI, "guided_regex": "a+", "guided_choice": ["x"]},
     ["only one of guided_regex and guided_choice"], "guided_choice"),
    ("guided_choice empty", {**HI, "guided_choice": []}, ["guided_choice"], "guided_choice"),
    ("structured_outputs with two", {**HI, "structured_outputs": {"regex": "a", "choice": ["b"]}},
     ["exactly one"], "structured_outputs"),
    ("vLLM's guided_grammar", {**HI, "guided_grammar": "root ::= \"a\""}, ["guided_grammar"],
     "guided_grammar"),
    ("max_tokens past the context", {"prompt": [1] * 60, "max_tokens": 10},
     ["maximum context length is 64 tokens", "70 tokens", "60 in the prompt"], "max_tokens"),
    ("batch mixing strings and ids", {"prompt": ["a", [1]]}, ["prompt[1]"], "prompt[1]"),
    ("token ids mixed with a list", {"prompt": [1, [2]]}, ["prompt[1]"], "prompt[1]"),
    ("batch with an empty prompt", {"prompt": [[1], []]}, ["prompt[1]", "empty"], "prompt[1]"),
    ("batch with a token outside vocab", {"prompt": [[1], [10**7]]}, ["prompt[1]", "vocabulary"],
     "prompt[1]"),
    ("batch prompt past the context", {"prompt": [[1], [1] * MAX_MODEL_LEN]},
     ["prompt[1]", "context length"], "prompt[1]"),
    ("model a number", {**HI, "model": 5}, ["model"], "model"),
    ("user a number", {**HI, "user": 5}, ["user"], "user"),
]


@pytest.mark.parametrize("body,words,param", [c[1:] for c in COMPLETION_BAD],
                         ids=[c[0] for c in COMPLETION_BAD])
async def test_invalid_completion_bodies_get_400_naming_the_field(client, controller, body,
                                                                 words, param):
    await expect_error(client, "POST", "/v1/completions", body, 400, *words, param=param)
    assert controller.submitted == []  # nothing invalid reaches the controller


MSG = [{"role": "user", "content": "hi"}]
CHAT_BAD = [
    ("missing messages", {"max_tokens": 4}, ["messages"], "messages"),
    ("messages null", {"messages": None}, ["messages"], "messages"),
    ("no messages", {"messages": []}, ["messages"], "messages"),
    ("messages an object", {"messages": {"role": "user"}}, ["messages"], "messages"),
    ("message a string", {"messages": ["hi"]}, ["messages[0]"], "messages[0]"),
    ("bad role", {"messages": [{"role": "wizard", "content": "hi"}]}, ["role"],
     "messages[0].role"),
    ("missing role", {"messages": [{"content": "hi"}]}, ["role"], "messages[0].role"),
    ("missing content", {"messages": [{"role": "user"}]}, ["content"], "messages[0].content"),
    ("content a number", {"messages": [{"role": "user", "content": 7}]}, ["content"],
     "messages[0].content"),
    ("image part", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, ["type"],
     "messages[0].content[0].type"),
    ("max_completion_tokens 0", {"messages": MSG, "max_completion_tokens": 0},
     ["max_completion_tokens"], "max_completion_tokens"),
    ("max_completion_tokens over the limit", {"messages": MSG, "max_completion_tokens": 10**6},
     ["max_completion_tokens", "limit"], "max_completion_tokens"),
    ("max_completion_tokens past the context", {"max_completion_tokens": 32, "max_tokens": 1,
                                                "messages": [{"role": "user",
                                                              "content": "word " * 20}]},
     ["maximum context length", "in the messages"], "max_completion_tokens"),
    ("logprobs a number", {"messages": MSG, "logprobs": 3}, ["logprobs"], "logprobs"),
    ("top_logprobs without logprobs", {"messages": MSG, "top_logprobs": 2},
     ["top_logprobs", "logprobs: true"], "top_logprobs"),
    ("top_logprobs 21", {"messages": MSG, "logprobs": True, "top_logprobs": 21},
     ["top_logprobs"], "top_logprobs"),
    ("a tool without its function", {"messages": MSG, "tools": [{"type": "function"}]},
     ["tools[0]"], "tools[0]"),
    ("a function without a name", {"messages": MSG, "tools": [{"type": "function",
                                                                "function": {}}]},
     ["name"], "tools[0].function.name"),
    ("tool parameters that do not compile", {"messages": MSG, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}]},
     ["compiled"], "tools[0].function.parameters"),
    ("tool_choice naming no tool", {"messages": MSG, "tool_choice": {
        "type": "function", "function": {"name": "g"}}, "tools": [
        {"type": "function", "function": {"name": "f"}}]}, ["'g'", "f"], "tool_choice"),
    ("tool_choice an unknown word", {"messages": MSG, "tool_choice": "always", "tools": [
        {"type": "function", "function": {"name": "f"}}]}, ["tool_choice"], "tool_choice"),
    ("a forced call and a response format", {"messages": MSG, "tool_choice": "required",
                                             "response_format": {"type": "json_object"},
                                             "tools": [{"type": "function",
                                                        "function": {"name": "f"}}]},
     ["forced tool call"], "response_format"),
    ("tool_choice required without tools", {"messages": MSG, "tool_choice": "required"},
     ["tool_choice"], "tool_choice"),
    ("functions", {"messages": MSG, "functions": [{"name": "f"}]}, ["functions"], "functions"),
    ("function_call forced", {"messages": MSG, "function_call": {"name": "f"}},
     ["function_call"], "function_call"),
    ("audio", {"messages": MSG, "audio": {"voice": "alloy", "format": "wav"}}, ["audio"], "audio"),
    ("modalities with audio", {"messages": MSG, "modalities": ["text", "audio"]},
     ["modalities"], "modalities"),
    ("reasoning_effort", {"messages": MSG, "reasoning_effort": "high"}, ["reasoning_effort"],
     "reasoning_effort"),
    ("verbosity", {"messages": MSG, "verbosity": "low"}, ["verbosity"], "verbosity"),
    ("web_search_options", {"messages": MSG, "web_search_options": {}}, ["web_search_options"],
     "web_search_options"),
    ("vLLM's chat echo", {"messages": MSG, "echo": True}, ["echo"], "echo"),
    ("a message without content or calls", {"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant"}]},
     ["content"], "messages[1].content"),
    ("n 0", {"messages": MSG, "n": 0}, ["n"], "n"),
    ("temperature -1", {"messages": MSG, "temperature": -1}, ["temperature"], "temperature"),
    ("top_p 2", {"messages": MSG, "top_p": 2}, ["top_p"], "top_p"),
]


@pytest.mark.parametrize("body,words,param", [c[1:] for c in CHAT_BAD],
                         ids=[c[0] for c in CHAT_BAD])
async def test_invalid_chat_bodies_get_400_naming_the_field(client, controller, body, words,
                                                           param):
    await expect_error(client, "POST", "/v1/chat/completions", body, 400, *words, param=param)
    assert controller.submitted == []


@pytest.mark.parametrize("path,head", [("/v1/completions", '{"prompt": "hi", '),
                                       ("/v1/chat/completions", '{"messages": ' + json.dumps(CHAT) + ', ')])
@pytest.mark.parametrize("depth", [1000, 100_000])
@pytest.mark.parametrize("kind", ["objects", "arrays"])
async def test_deeply_nested_json_in_an_unread_field_is_a_400(controller, path, head, depth,
                                                             kind):
    nested = '{"a": ' * depth + "1" + "}" * depth if kind == "objects" else "[" * depth + "]" * depth
    async with api_client(controller, **{**LIMITS, "max_body_bytes": 1 << 20}) as client:
        error = await expect_error(client, "POST", path, head + '"x": ' + nested + "}", 400,
                                   "nested")
        assert error["param"] is None
        assert controller.submitted == []
        assert (await call(client, "POST", "/v1/completions", HI))[0].status == 200  # serving


async def test_unknown_model_is_404_naming_it(client):
    error = await expect_error(client, "POST", "/v1/completions", {**HI, "model": "gpt-9"}, 404,
                               "model", "gpt-9", "tiny")
    assert error["code"] == "model_not_found"


async def test_valid_requests_at_the_limits_are_served(client, controller):
    resp, raw = await call(client, "POST", "/v1/completions",
                           {"prompt": [1] * (MAX_MODEL_LEN - MAX_TOKENS_LIMIT),
                            "max_tokens": MAX_TOKENS_LIMIT,
                            "temperature": 2, "top_p": 1, "top_k": -1, "seed": -(2**63),
                            "stop": ["x", "y", "z", "w"], "model": "tiny", "priority": 100,
                            "ttft_slo": 86400, "n": 1, "presence_penalty": -2,
                            "frequency_penalty": 2, "logit_bias": {"0": -100, "1023": 100},
                            "logprobs": 5, "best_of": 1, "suffix": "", "user": "u"})
    assert resp.status == 200, raw
    assert json.loads(raw)["usage"]["completion_tokens"] == MAX_TOKENS_LIMIT
    # A prompt one short of the context, max_tokens unset: clipped to the one that fits.
    resp, raw = await call(client, "POST", "/v1/completions", {"prompt": [1] * (MAX_MODEL_LEN - 1)})
    assert resp.status == 200, raw
    assert json.loads(raw)["usage"]["completion_tokens"] == 1
    resp, raw = await call(client, "POST", "/v1/chat/completions",
                           {"messages": CHAT, "max_completion_tokens": 3})
    assert resp.status == 200, raw
    assert controller.submitted[-1][1].max_tokens == 3


# ---- prompt length: 400 stating the limit ---------------------------------------------------

async def test_token_prompt_longer_than_the_context_states_the_limit(client):
    error = await expect_error(client, "POST", "/v1/completions", {"prompt": [1] * MAX_MODEL_LEN},
                               400, "prompt", str(MAX_MODEL_LEN), str(MAX_MODEL_LEN - 1),
                               param="prompt")
    assert "limit" in error["message"]


async def test_text_prompt_longer_than_the_context_states_the_limit(client):
    await expect_error(client, "POST", "/v1/completions", {"prompt": "word " * 400}, 400,
                       "prompt", "limit", f"context length {MAX_MODEL_LEN}", param="prompt")


async def test_chat_longer_than_the_context_names_messages_and_the_limit(client):
    await expect_error(client, "POST", "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "word " * 400}]}, 400,
                       "messages", "limit", f"context length {MAX_MODEL_LEN}", param="messages")


async def test_no_ready_instance_is_503_not_a_prompt_limit(client, controller):
    controller.max_model_len = 0  # e.g. the only instance is restarting
    error = await expect_error(client, "POST", "/v1/completions", HI, 503, "no instance")
    assert error["code"] == "unavailable"


def test_nesting_limit_is_the_servers_own_whatever_the_python():
    """128 levels parse, 129 are refused, brackets inside strings are text (Python 3.12's
    msgspec took the 1,000 levels that 3.11's refused: the limit must not follow the stack)."""
    from daemon.openai_schema import MAX_NESTING, CompletionRequest, nesting_depth, parse_body
    inner = "[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1)
    assert nesting_depth(('{"x": ' + inner + "}").encode()) == MAX_NESTING
    assert parse_body(('{"prompt": "hi", "x": ' + inner + "}").encode(), CompletionRequest)
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_body(('{"prompt": "hi", "x": [' + inner + "]}").encode(), CompletionRequest)
    text = '"' + "[{" * 500 + '\\"' + '"'
    assert nesting_depth(('{"prompt": ' + text + "}").encode()) == 1
