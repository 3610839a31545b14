"""Tool calling (daemon/tool_calls.py): tools rendered through a real chat template
(Qwen2.5's, tests/chat_templates/), calls parsed back in each model family's format,
streamed or not, and the grammar of a forced call.

Covers: daemon/tool_calls.py, engines/models/tokenizer.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon.tool_calls import (
    HERMES, LLAMA3_JSON, MISTRAL, ToolCallStream, ToolError, call_lark, format_of, plan_tools,
    split_calls,
)
from engines.grammar import Grammars
from engines.models.tokenizer import render_chat
from ipc.params import GrammarSpec

QWEN25 = (Path(__file__).parent / "chat_templates" / "qwen2_5_instruct.jinja").read_text()
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
NAMES = frozenset({"get_weather"})
CHAT = [{"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                          "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "sunny"}]

#: What Qwen2.5's template makes of CHAT with WEATHER (its documented hermes layout).
QWEN25_EXPECTED = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather of a '
    'city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, '
    '"required": ["city"]}}}\n</tools>\n\nFor each function call, return a json object with '
    "function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\nWeather in Oslo?<|im_end|>\n"
    '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    "\n</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n")


def test_qwen25_template_renders_tools_as_the_model_expects():
    ours = render_chat(QWEN25, CHAT, True, tools=[WEATHER])
    assert ours == QWEN25_EXPECTED
    from transformers.utils.chat_template_utils import render_jinja_template
    (reference,), _ = render_jinja_template([CHAT], tools=[WEATHER], chat_template=QWEN25,
                                            add_generation_prompt=True)
    assert ours == reference
    assert format_of(QWEN25) is HERMES


def test_formats_are_read_off_the_template():
    assert format_of("{{ '<|python_tag|>' }} ipython") is LLAMA3_JSON
    assert format_of("[AVAILABLE_TOOLS] [TOOL_CALLS]") is MISTRAL
    assert format_of(None) is HERMES


@pytest.mark.parametrize("fmt,text,content", [
    (HERMES, 'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
             '\n</tool_call>', "Let me look."),
    (LLAMA3_JSON, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}', ""),
    (MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}]', ""),
])
def test_each_format_parses_to_the_same_call(fmt, text, content):
    end, calls = split_calls(text, fmt, NAMES, final=True)
    assert text[:end] == content
    assert calls == [("get_weather", {"city": "Oslo"})]


def test_an_unknown_name_or_plain_text_is_content():
    text = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    assert split_calls(text, HERMES, NAMES, final=True)[1] == []
    assert split_calls('{"a": 1}', LLAMA3_JSON, NAMES, final=True) == (8, [])


def test_streamed_pieces_give_the_content_and_calls_of_the_whole():
    text = ('Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
            '</tool_call><tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}'
            "\n</tool_call>")
    plan = plan_tools([WEATHER], "auto", QWEN25)
    stream, content, calls = ToolCallStream(plan), "", []
    for i, char in enumerate(text):
        piece, new = stream.add(char, final=i == len(text) - 1)
        content += piece
        calls += new
        assert "<" not in content  # a possible start of a call is held back
    assert content == "Sure." == stream.content()
    assert [(c["index"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in calls] == [(0, "get_weather", {"city": "Oslo"}),
                                (1, "get_weather", {"city": "Rome"})]


def test_tool_choice_must_name_a_tool():
    with pytest.raises(ToolError) as info:
        plan_tools([WEATHER], {"type": "function", "function": {"name": "nope"}}, QWEN25)
    assert info.value.param == "tool_choice"
    assert plan_tools([WEATHER], "none", QWEN25) is None
    assert plan_tools([WEATHER], "auto", QWEN25).grammar() is None


def test_a_forced_call_is_one_call_of_a_listed_tool(tokenizer):
    grammars = Grammars.for_tokenizer(tokenizer)
    spec = GrammarSpec("lark", call_lark(HERMES, [WEATHER]))
    assert plan_tools([WEATHER], "required", QWEN25).grammar() == spec

    def accepts(text: str) -> bool:
        matcher = grammars.matcher(spec)
        return matcher.consume_tokens(tokenizer.encode(text, add_bos=False)) \
            and matcher.is_accepting()

    assert accepts('<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo"}}\n</tool_call>')
    assert not accepts('<tool_call>\n{"name":"other","arguments":{"city":"Oslo"}}\n</tool_call>')
    assert not accepts('<tool_call>\n{"name":"get_weather","arguments":{}}\n</tool_call>')
