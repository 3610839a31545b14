"""Tool calling on chat: the tools go into the prompt through the model's chat template,
and the model's calls come back as OpenAI `tool_calls`.

Each model family writes a call its own way; the format is read off its chat template:

* hermes (Qwen2.5, Hermes, and any template that does not render tools itself):
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`;
* llama3_json (Llama 3.1/3.2 templates, `<|python_tag|>` / ipython): the reply is
  `{"name": ..., "parameters": {...}}`;
* mistral (`[TOOL_CALLS]` in the template): `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`.

A template that does not mention `tools` (the tiny model's) gets them as a system
message in the hermes wording Qwen2.5's template uses. `tool_choice`:
"none" renders no tools and parses nothing; "auto" leaves the output free and parses
calls with the format's parser (`split_calls`: a call is detected by its start marker,
or for llama3_json by a reply that is one JSON object naming a tool); "required" or a
named function constrains the output (a Lark grammar with the call's JSON schema
embedded, engines/grammar.py) to exactly one call of one of the tools / of that one.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from ipc.params import GrammarSpec
from engines.grammar import JSON_OPTIONS


class ToolError(ValueError):
    """A 400 about one field: `param` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True)
class ToolFormat:
    name: str
    start: str            # what opens a call ("" for llama3_json)
    end: str              # what closes it
    arguments_key: str    # the key of a call's arguments


HERMES = ToolFormat("hermes", "<tool_call>\n", "\n</tool_call>", "arguments")
LLAMA3_JSON = ToolFormat("llama3_json", "", "", "parameters")
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS][", "]", "arguments")


def format_of(template: str | None) -> ToolFormat:
    """The tool-call format a chat template teaches its model."""
    template = template or ""
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<|python_tag|>" in template or "ipython" in template:
        return LLAMA3_JSON
    return HERMES


def renders_tools(template: str | None) -> bool:
    return bool(template) and "tools" in template


@dataclass
class ToolPlan:
    """What a chat request's `tools` and `tool_choice` make of it."""
    fmt: ToolFormat
    tools: list[dict]                  # OpenAI tool definitions, as sent
    forced: str | None                 # "required", a function name, or None (auto)
    names: frozenset[str] = field(default_factory=frozenset)

    def grammar(self) -> GrammarSpec | None:
        """The constraint of a forced call; None for auto."""
        if self.forced is None:
            return None
        tools = [t for t in self.tools if self.forced == "required"
                 or t["function"]["name"] == self.forced]
        return GrammarSpec("lark", call_lark(self.fmt, tools))


def plan_tools(tools: list[dict[str, Any]] | None, tool_choice, template: str | None,
               ) -> ToolPlan | None:
    """The request's tool plan; None when no tool can be called. ToolError naming the
    field for a malformed tool or a choice naming no tool."""
    if not tools or tool_choice == "none":
        if isinstance(tool_choice, dict) or tool_choice == "required":
            raise ToolError("tool_choice", "there is nothing to call: send tools")
        return None
    names = []
    for i, tool in enumerate(tools):
        function = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise ToolError(f"tools[{i}]", 'a tool is {"type": "function", "function": {...}}')
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ToolError(f"tools[{i}].function.name", "a function needs a name")
        parameters = function.get("parameters", {"type": "object"})
        if not isinstance(parameters, dict):
            raise ToolError(f"tools[{i}].function.parameters", "must be a JSON schema object")
        names.append(name)
    forced = None
    if tool_choice == "required":
        forced = "required"
    elif isinstance(tool_choice, dict):
        function = tool_choice.get("function") if tool_choice.get("type") == "function" else None
        name = function.get("name") if isinstance(function, dict) else None
        if name not in names:
            raise ToolError("tool_choice", f"names no function of tools ({name!r}; tools: "
                                           f"{', '.join(names)})")
        forced = name
    return ToolPlan(format_of(template), list(tools), forced, frozenset(names))


def call_schema(fmt: ToolFormat, tools: list[dict]) -> dict:
    """The JSON schema of one call of one of `tools` in `fmt`."""
    options = [{"type": "object", "properties": {
        "name": {"const": t["function"]["name"]},
        fmt.arguments_key: t["function"].get("parameters") or {"type": "object"}},
        "required": ["name", fmt.arguments_key], "additionalProperties": False}
        for t in tools]
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": JSON_OPTIONS}


def call_lark(fmt: ToolFormat, tools: list[dict]) -> str:
    """A Lark grammar (llguidance's) of exactly one call, its JSON checked by the schema."""
    parts = [json.dumps(fmt.start)] if fmt.start else []
    parts.append("call")
    if fmt.end:
        parts.append(json.dumps(fmt.end))
    return f"start: {' '.join(parts)}\ncall: %json {json.dumps(call_schema(fmt, tools))}\n"


# -- rendering ------------------------------------------------------------------------

def system_tools_message(tools: list[dict]) -> dict:
    """The tools as a system message (hermes wording), for templates that ignore `tools`."""
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return {"role": "system", "content": (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        f"{listed}\n</tools>\n\nFor each function call, return a json object with function "
        "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')}


def template_message(message) -> dict:
    """A daemon.openai_schema.ChatMessage as chat templates read it: tool calls with their
    arguments as objects (as transformers passes them), tool results with their id."""
    rendered: dict[str, Any] = message.for_template()
    if message.tool_calls:
        rendered["tool_calls"] = [_template_call(c) for c in message.tool_calls]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    return rendered


def _template_call(call: dict) -> dict:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments)
        except ValueError:
            pass
    return {"type": "function", "id": call.get("id"), "function": function}


# -- parsing --------------------------------------------------------------------------

def new_call(name: str, arguments: Any, index: int) -> dict:
    """One OpenAI tool call (`index`: its place, which the stream deltas carry)."""
    return {"index": index, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def _call_of(obj: Any, fmt: ToolFormat, names: frozenset[str]) -> tuple[str, Any] | None:
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    arguments = obj.get(fmt.arguments_key, obj.get("arguments", obj.get("parameters", {})))
    return obj["name"], arguments


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def split_calls(text: str, fmt: ToolFormat, names: frozenset[str], final: bool,
                ) -> tuple[int, list[tuple[str, Any]]]:
    """(how much of `text` is surely content, the complete calls in it). Before `final`
    a possible start of a call is held back (not yet content)."""
    if fmt is LLAMA3_JSON:
        return _split_llama(text, names, final)
    at = text.find(fmt.start.rstrip("\n"))
    if at < 0:
        return (len(text) if final else _safe_end(text, fmt.start.rstrip("\n"))), []
    calls = []
    if fmt is MISTRAL:
        listed = _json(text[at + len(fmt.start) - 1:].strip())
        for obj in listed if isinstance(listed, list) else []:
            call = _call_of(obj, fmt, names)
            if call:
                calls.append(call)
        return at, calls
    opener, closer = fmt.start.rstrip("\n"), fmt.end.lstrip("\n")
    rest = text[at:]
    while opener in rest:
        rest = rest[rest.find(opener) + len(opener):]
        end = rest.find(closer)
        if end < 0 and not final:
            break
        body = rest if end < 0 else rest[:end]
        call = _call_of(_json(body.strip()), fmt, names)
        if call:
            calls.append(call)
        if end < 0:
            break
        rest = rest[end + len(closer):]
    return at, calls


def _safe_end(text: str, marker: str) -> int:
    """`len(text)` less its longest ending that begins `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return len(text) - k
    return len(text)


def _split_llama(text: str, names: frozenset[str], final: bool):
    body = text.strip()
    body = body.removeprefix("<|python_tag|>").strip()
    if not body or body.startswith("{"):
        if not final:
            return 0, []
        calls = [c for c in (_call_of(_json(part), LLAMA3_JSON, names)
                             for part in body.split(";")) if c]
        return (0, calls) if calls else (len(text), [])
    return len(text), []


class ToolCallStream:
    """A choice's text as it streams: what is content, and each call once complete."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self.sent = 0
        self.calls: list[dict] = []

    def add(self, piece: str, final: bool) -> tuple[str, list[dict]]:
        """(the new content, the calls completed) after `piece`."""
        self.text += piece
        end, calls = split_calls(self.text, self.plan.fmt, self.plan.names, final)
        content = self.text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        new = [new_call(name, arguments, len(self.calls) + k)
               for k, (name, arguments) in enumerate(calls[len(self.calls):])]
        self.calls.extend(new)
        return content, new

    def content(self) -> str | None:
        """The whole reply's content (None when it is only calls)."""
        text = self.text[:self.sent]
        return text if text.strip() or not self.calls else None
