"""Structured output: from a request's fields to the grammar its output must match.

OpenAI's `response_format` (`json_object`; `json_schema` with its `schema`), vLLM's
`guided_json` / `guided_regex` / `guided_choice`, and vLLM's newer `structured_outputs`
object (`json`, `regex`, `choice`) each become an ipc.params.GrammarSpec; a forced tool
call's comes from daemon/tool_calls.py. At most one may be given. The spec is compiled
here before anything is submitted -- on a worker thread, not the event loop, and cached
per model (engines/grammar.py) -- so a schema the library cannot compile is a 400
naming its field; the instances compile it again (their own cache) when it runs.
"""
from __future__ import annotations

import asyncio
import json
import weakref
from typing import Any

from engines.grammar import GrammarError, Grammars
from ipc.params import GrammarSpec

#: The schema of `{"type": "json_object"}`: any JSON object.
ANY_OBJECT = '{"type": "object"}'


class GrammarFieldError(ValueError):
    """A 400 about one field: `param` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


def requested_grammar(body) -> tuple[str, GrammarSpec] | None:
    """(the field, its spec) of the one structured-output field `body` sets; None for
    none. GrammarFieldError for two at once or one malformed."""
    found = [(field, spec) for field, spec in _candidates(body) if spec is not None]
    if len(found) > 1:
        raise GrammarFieldError(found[1][0], f"give only one of {found[0][0]} and "
                                             f"{found[1][0]}")
    return found[0] if found else None


def _candidates(body):
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_object":
        yield "response_format", GrammarSpec("json_schema", ANY_OBJECT)
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise GrammarFieldError("response_format.json_schema.schema",
                                    "a json_schema response format needs its schema")
        yield "response_format.json_schema.schema", _schema(fmt.json_schema.schema_)
    yield "guided_json", _schema(body.guided_json)
    yield "guided_regex", _regex(body.guided_regex)
    yield "guided_choice", _choice("guided_choice", body.guided_choice)
    outputs = body.structured_outputs
    if outputs is not None:
        given = [(f"structured_outputs.{name}", spec) for name, spec in (
            ("json", _schema(outputs.json)), ("regex", _regex(outputs.regex)),
            ("choice", _choice("structured_outputs.choice", outputs.choice))) if spec]
        if len(given) != 1:
            raise GrammarFieldError("structured_outputs",
                                    "give exactly one of json, regex and choice")
        yield given[0]


def _schema(schema: dict[str, Any] | str | bool | None) -> GrammarSpec | None:
    if schema is None:
        return None
    # not sorted: the order of its properties is the order they are written in
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return GrammarSpec("json_schema", text)


def _regex(regex: str | None) -> GrammarSpec | None:
    return None if regex is None else GrammarSpec("regex", regex)


def _choice(field: str, options: list[str] | None) -> GrammarSpec | None:
    if options is None:
        return None
    if not options:
        raise GrammarFieldError(field, "give at least one choice")
    return GrammarSpec("choice", json.dumps(options))


class GrammarChecks:
    """Compiles specs for the API, one engines.grammar.Grammars per tokenizer (made on
    first use, on a worker thread: a large vocabulary takes about a second)."""

    def __init__(self) -> None:
        self._by_tokenizer: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _grammars(self, tokenizer) -> Grammars:
        found = self._by_tokenizer.get(tokenizer)
        if found is None:
            found = self._by_tokenizer[tokenizer] = Grammars.for_tokenizer(tokenizer)
        return found

    def _check(self, tokenizer, spec: GrammarSpec) -> None:
        self._grammars(tokenizer).check(spec)

    async def check(self, tokenizer, field: str, spec: GrammarSpec) -> None:
        """GrammarFieldError naming `field` when `spec` does not compile."""
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._check, tokenizer, spec)
        except GrammarError as exc:
            raise GrammarFieldError(field, f"cannot be compiled: {exc}") from None


#: The API's (one per daemon process).
CHECKS = GrammarChecks()
