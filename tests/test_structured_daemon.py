"""End to end: structured outputs and tool calls through the official `openai` client,
against the real daemon (torch executor, the tiny random-weight model, CPU).

The model's weights are random, so only the grammar makes its output JSON: every reply
that ends on its own (`stop`) must parse and match its schema.

Covers: daemon/structured.py, daemon/tool_calls.py, daemon/api.py.
"""
from __future__ import annotations

import json
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

from tests.daemon_fixture import start_daemon, torch_args

pytestmark = pytest.mark.slow  # against a daemon subprocess

MODEL = "tiny"
CHAT = [{"role": "user", "content": "Describe a pet as JSON."}]


class Position(BaseModel):
    x: int = Field(ge=-9, le=9)
    y: bool


class Pet(BaseModel):
    kind: Literal["cat", "dog", "fish"]
    name: str = Field(max_length=6)
    tags: list[Literal["old", "new"]] = Field(max_length=2)
    at: Position


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8},
        "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"],
        "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"enum": ["utc", "cet"]}}, "required": ["zone"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def client(tmp_path_factory, daemon_cache, tiny_models):
    daemon = start_daemon(tmp_path_factory.mktemp("structured-daemon"), "--model",
                          str(tiny_models["llama"]), *torch_args(), "--served-model-name", MODEL,
                          cache_dir=daemon_cache)
    c = openai.OpenAI(base_url=daemon.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    yield c
    c.close()
    daemon.close()


def test_parse_with_a_pydantic_model_gives_the_model(client):
    completion = client.chat.completions.parse(model=MODEL, messages=CHAT, response_format=Pet,
                                               max_completion_tokens=200, seed=3)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Pet)
    assert Pet.model_validate_json(choice.message.content) == choice.message.parsed


def test_json_schema_on_completions(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    for seed in range(3):
        answer = client.completions.create(model=MODEL, prompt="JSON:", max_tokens=40, seed=seed,
                                           extra_body={"response_format": {
                                               "type": "json_schema", "json_schema": {
                                                   "name": "flag", "schema": schema}}})
        assert answer.choices[0].finish_reason == "stop"
        assert isinstance(json.loads(answer.choices[0].text)["ok"], bool)


def test_vllm_guided_choice_and_regex(client):
    choice = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10,
                                            extra_body={"guided_choice": ["yes", "no"]})
    assert choice.choices[0].message.content in ("yes", "no")
    regex = client.completions.create(model=MODEL, prompt="n:", max_tokens=10,
                                      extra_body={"structured_outputs": {"regex": "[0-9]{3}"}})
    assert len(regex.choices[0].text) == 3 and regex.choices[0].text.isdigit()


def _check_call(call, names=("get_weather", "get_time")):
    assert call.type == "function" and call.id and call.function.name in names
    arguments = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(arguments) == {"city", "unit"} and arguments["unit"] in ("c", "f")
    else:
        assert arguments["zone"] in ("utc", "cet")


def test_tool_call_round_trip(client):
    first = client.chat.completions.create(model=MODEL, messages=CHAT, tools=[WEATHER, TIME],
                                           tool_choice="required", max_tokens=80, seed=1)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    _check_call(call)
    history = [*CHAT, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    named = client.chat.completions.create(
        model=MODEL, messages=history, tools=[WEATHER, TIME], max_tokens=80, seed=2,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert [c.function.name for c in named.choices[0].message.tool_calls] == ["get_time"]
    _check_call(named.choices[0].message.tool_calls[0])


def test_streamed_tool_call_is_the_openai_delta_shape(client):
    with client.chat.completions.stream(model=MODEL, messages=CHAT, tools=[WEATHER],
                                        tool_choice="required", max_tokens=80, seed=1) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    _check_call(choice.message.tool_calls[0])
    unstreamed = client.chat.completions.create(model=MODEL, messages=CHAT, tools=[WEATHER],
                                                tool_choice="required", max_tokens=80, seed=1)
    assert (unstreamed.choices[0].message.tool_calls[0].function.arguments
            == choice.message.tool_calls[0].function.arguments)


def test_auto_tools_leave_the_reply_free(client):
    answer = client.chat.completions.create(model=MODEL, messages=CHAT, tools=[WEATHER],
                                            max_tokens=16, seed=0)
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert message.content or message.tool_calls
